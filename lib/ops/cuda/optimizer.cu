// AdamW update (fp32 master weights and state, optional compute-dtype weight copy), the
// deterministic fp64 sums of the gradient norm and the loss, and the update's control.
// Both the update and the norm are multi-tensor: a launch covers many tensors (32
// segments, 64 spans), each block working on one of them, so a step's optimizer is a
// handful of launches rather than a few per tensor.
#include <algorithm>
#include <vector>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 256;

struct AdamWArgs {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, inv_bc1, inv_bc2, grad_scale;
};

// The segments of one multi-tensor launch, by value in the kernel's parameters (within
// their 4 KiB): segment i's indices (ops::AdamWSegment), whether its arrays allow 16-byte
// packs, and the blocks of segments 0..i (block b works on segment i where
// blocks_through[i-1] <= b < blocks_through[i]).
struct AdamWBatch {
  static constexpr int kMax = 32;
  int count;
  std::size_t arena[kMax], param[kMax], state[kMax], n[kMax];
  float weight_decay[kMax];
  unsigned blocks_through[kMax];
  bool vec[kMax];
};
constexpr int kAdamWPacksPerThread = 4;  // a block's share: this many packs of 4 a thread
constexpr std::size_t kAdamWChunk = std::size_t(kThreads) * 4 * kAdamWPacksPerThread;

// The CPU AdamW's operations in its order; the _rn intrinsics keep the compiler from
// fusing multiplies and adds, so each step rounds as it does on the CPU:
//   g = grad * grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*(g*g);
//   p -= lr * ((m*inv_bc1) / (sqrt(v*inv_bc2) + eps) + wd*p).
template <typename T, int M>
__device__ void adamw_pack(float* params, T* weights, const float* grads, float* m, float* v,
                           const AdamWArgs& h, float weight_decay) {
  Pack<float, M> p = load_pack<M>(params), mi = load_pack<M>(m), vi = load_pack<M>(v);
  const Pack<float, M> gi = load_pack<M>(grads);
  Pack<T, M> out;
#pragma unroll
  for (int k = 0; k < M; ++k) {
    const float g = __fmul_rn(gi.v[k], h.grad_scale);
    mi.v[k] = __fadd_rn(__fmul_rn(h.beta1, mi.v[k]), __fmul_rn(h.one_minus_beta1, g));
    vi.v[k] =
        __fadd_rn(__fmul_rn(h.beta2, vi.v[k]), __fmul_rn(h.one_minus_beta2, __fmul_rn(g, g)));
    const float m_hat = __fmul_rn(mi.v[k], h.inv_bc1);
    const float v_hat = __fmul_rn(vi.v[k], h.inv_bc2);
    const float step = __fadd_rn(__fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), h.eps)),
                                 __fmul_rn(weight_decay, p.v[k]));
    p.v[k] = __fsub_rn(p.v[k], __fmul_rn(h.lr, step));
    out.v[k] = from_f32<T>(p.v[k]);
  }
  store_pack<M>(params, p);
  store_pack<M>(m, mi);
  store_pack<M>(v, vi);
  if (weights != nullptr) store_pack<M>(weights, out);
}

// Block b updates chunk j of its segment: elements [j kAdamWChunk, (j+1) kAdamWChunk).
template <typename T>
__global__ void adamw_kernel(float* __restrict__ params, T* weights,
                             const float* __restrict__ grads, float* __restrict__ m,
                             float* __restrict__ v, AdamWBatch batch, AdamWArgs h,
                             const float* control, const float* schedule) {
  if (control != nullptr) {
    if (control[1] == 0.0f) return;
    h.grad_scale = control[0];
  }
  if (schedule != nullptr) h.lr = schedule[0], h.inv_bc1 = schedule[1], h.inv_bc2 = schedule[2];
  int i = 0;
  while (blockIdx.x >= batch.blocks_through[i]) ++i;
  const unsigned first_block = i == 0 ? 0 : batch.blocks_through[i - 1];
  const std::size_t begin = (blockIdx.x - first_block) * kAdamWChunk;
  const std::size_t end = batch.n[i] < begin + kAdamWChunk ? batch.n[i] : begin + kAdamWChunk;
  float* p = params + batch.param[i];
  T* w = weights != nullptr ? weights + batch.arena[i] : nullptr;
  const float* g = grads + batch.arena[i];
  float* mi = m + batch.state[i];
  float* vi = v + batch.state[i];
  const float wd = batch.weight_decay[i];
  std::size_t tail = begin;  // one element at a time from here: all of it when misaligned
  if (batch.vec[i]) {
    tail = begin + (end - begin) / 4 * 4;
    for (std::size_t e = begin + threadIdx.x * 4; e < tail; e += kThreads * 4)
      adamw_pack<T, 4>(p + e, w ? w + e : nullptr, g + e, mi + e, vi + e, h, wd);
  }
  for (std::size_t k = tail + threadIdx.x; k < end; k += kThreads)
    adamw_pack<T, 1>(p + k, w ? w + k : nullptr, g + k, mi + k, vi + k, h, wd);
}

// The spans of one sum-of-squares launch, by value: span i's array, its blocks, and the
// blocks of spans 0..i (as AdamWBatch's); this launch's partial sums start at part
// first_part.
struct SquaresBatch {
  static constexpr int kMax = 64;
  int count;
  unsigned first_part;
  const float* data[kMax];
  std::size_t n[kMax];
  unsigned blocks[kMax], blocks_through[kMax];
};

// part[first_part + b] = the sum in fp64 of x^2 over block b's share of its span: the
// elements j kThreads + t, stepping by the span's blocks times kThreads.
__global__ void sum_squares_partial_kernel(double* __restrict__ part, SquaresBatch batch) {
  __shared__ double red[32];
  int i = 0;
  while (blockIdx.x >= batch.blocks_through[i]) ++i;
  const unsigned j = blockIdx.x - (i == 0 ? 0 : batch.blocks_through[i - 1]);
  const float* x = batch.data[i];
  const std::size_t n = batch.n[i], stride = std::size_t(batch.blocks[i]) * blockDim.x;
  double acc = 0.0;
  for (std::size_t e = std::size_t(j) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const double d = x[e];
    acc += d * d;
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) part[batch.first_part + blockIdx.x] = acc;
}

// *out = sum of part[0, count) (one block; fixed order).
__global__ void sum_squares_final_kernel(double* __restrict__ out, const double* __restrict__ part,
                                         int count) {
  __shared__ double red[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += part[i];
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) *out = acc;
}

// *total += double(float(sum / n)): one block, each thread's strided share, then a tree.
__global__ void add_mean_kernel(double* __restrict__ total, const float* __restrict__ x,
                                std::size_t n) {
  __shared__ double red[32];
  double acc = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(x[i]);
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) *total += static_cast<double>(static_cast<float>(acc / static_cast<double>(n)));
}

__global__ void update_control_kernel(float* __restrict__ control, const double* __restrict__ stats,
                                      double grad_clip) {
  const double norm = sqrt(stats[1]);
  control[0] = grad_clip > 0.0 && norm > grad_clip ? static_cast<float>(grad_clip / (norm + 1e-6))
                                                   : 1.0f;
  control[1] = isfinite(stats[0]) && isfinite(norm) ? 1.0f : 0.0f;
}

}  // namespace

void add_mean(double* total, const float* x, std::size_t n, cudaStream_t s) {
  PPTRAIN_CHECK(total && x && n >= 1, "add_mean: bad arguments");
  add_mean_kernel<<<1, kThreads, 0, s>>>(total, x, n);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

void update_control(float* control, const double* stats, double grad_clip, cudaStream_t s) {
  PPTRAIN_CHECK(control && stats, "update_control: null pointer");
  update_control_kernel<<<1, 1, 0, s>>>(control, stats, grad_clip);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void adamw(float* params, T* weights, const float* grads, float* m, float* v,
           const std::vector<AdamWTensor>& segments, float lr, float beta1, float beta2,
           float one_minus_beta1, float one_minus_beta2, float eps, float inv_bc1, float inv_bc2,
           float grad_scale, const float* control, const float* schedule, cudaStream_t s) {
  PPTRAIN_CHECK(params && grads && m && v, "adamw: null pointer");
  const AdamWArgs h{lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, inv_bc1, inv_bc2,
                    grad_scale};
  // Launches of up to AdamWBatch::kMax segments each.
  AdamWBatch batch{};
  unsigned blocks = 0;
  auto launch = [&] {
    if (batch.count == 0) return;
    adamw_kernel<T><<<blocks, kThreads, 0, s>>>(params, weights, grads, m, v, batch, h, control,
                                                 schedule);
    PPTRAIN_CUDA_CHECK_LAUNCH();
    batch = AdamWBatch{};
    blocks = 0;
  };
  for (const AdamWTensor& seg : segments) {
    if (seg.n == 0) continue;
    const int i = batch.count++;
    batch.arena[i] = seg.arena, batch.param[i] = seg.param, batch.state[i] = seg.state;
    batch.n[i] = seg.n, batch.weight_decay[i] = seg.weight_decay;
    batch.vec[i] = aligned16({params + seg.param, weights ? weights + seg.arena : nullptr,
                              grads + seg.arena, m + seg.state, v + seg.state});
    const std::size_t chunks = (seg.n + kAdamWChunk - 1) / kAdamWChunk;
    PPTRAIN_CHECK(blocks + chunks < (1u << 31), "adamw: too many blocks");
    blocks += static_cast<unsigned>(chunks);
    batch.blocks_through[i] = blocks;
    if (batch.count == AdamWBatch::kMax) launch();
  }
  launch();
}

std::size_t sum_squares_partials(std::size_t spans) { return kCudaSumSquaresPartials + spans; }

void sum_squares(double* out, const std::vector<SquaredArray>& spans, double* partials,
                 cudaStream_t s) {
  PPTRAIN_CHECK(out != nullptr, "sum_squares: null pointer");
  std::size_t total = 0;
  for (const SquaredArray& x : spans) total += x.n;
  if (total == 0) {
    PPTRAIN_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  PPTRAIN_CHECK(partials != nullptr, "sum_squares: null pointer");
  // A span's blocks: its share of kCudaSumSquaresPartials by size, at least one, at most
  // one a kThreads elements. They depend only on the spans' sizes, so the order of the
  // sums is fixed for given spans.
  SquaresBatch batch{};
  unsigned blocks = 0, parts = 0;
  auto launch = [&] {
    if (batch.count == 0) return;
    sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(partials, batch);
    PPTRAIN_CUDA_CHECK_LAUNCH();
    parts += blocks;
    batch = SquaresBatch{};
    batch.first_part = parts;
    blocks = 0;
  };
  for (const SquaredArray& x : spans) {
    if (x.n == 0) continue;
    PPTRAIN_CHECK(x.data != nullptr, "sum_squares: null pointer");
    const std::size_t share = std::size_t(double(kCudaSumSquaresPartials) * double(x.n) / double(total));
    const std::size_t most = (x.n + kThreads - 1) / kThreads;
    const unsigned b = static_cast<unsigned>(std::min(most, 1 + share));
    const int i = batch.count++;
    batch.data[i] = x.data, batch.n[i] = x.n, batch.blocks[i] = b;
    blocks += b;
    batch.blocks_through[i] = blocks;
    if (batch.count == SquaresBatch::kMax) launch();
  }
  launch();
  PPTRAIN_CHECK(parts <= sum_squares_partials(spans.size()), "sum_squares: too many partial sums");
  sum_squares_final_kernel<<<1, kThreads, 0, s>>>(out, partials, static_cast<int>(parts));
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

#define PPTRAIN_INSTANTIATE(T)                                                              \
  template void adamw<T>(float*, T*, const float*, float*, float*,                          \
                         const std::vector<AdamWTensor>&, float, float, float, float, float,  \
                         float, float, float, float, const float*, const float*, cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
