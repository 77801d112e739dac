// Softmax cross-entropy CUDA kernels, a block per row (phase 2 below: a thread per row),
// fp32 throughout: the fused op over the first V of Vp columns, and the three phases of
// the vocab-parallel form over a shard of Vl columns starting at col_begin (the shard's
// largest value and sum of exponentials, that sum scaled to the max over the shards, the
// finish). Either reads a row twice: its largest value and sum of exponentials in one
// pass, then the gradient.
// Columns past the real vocabulary are masked out and get gradient 0. dlogits may
// alias logits: every value a thread needs is read before the block's last barrier,
// and afterwards each thread writes only the elements it reads itself.
#include <cmath>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 512;

// A row's loads go in W-wide packs; with W > 1 the row length (cols) is a multiple of
// W and the row is 16-byte aligned, so a pack starting below `real` (<= cols) is in
// bounds.

// The row's largest value m and its sum of exp(x[j] - m) over j < real, in one pass:
// each thread keeps its own running largest value and a sum scaled to it (rescaled when
// that grows); the block then scales each thread's sum to the row's largest value.
template <typename T, int W>
__device__ float2 row_max_and_exp_sum(const T* x, int real, float* red) {
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x * W; j < real; j += blockDim.x * W) {
    const Pack<T, W> p = load_pack<W>(x + j);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (j + k >= real) continue;
      const float v = to_f32(p.v[k]);
      if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
      } else {
        s += expf(v - m);
      }
    }
  }
  const float row = block_max(m, red);
  return {row, block_sum(m == -INFINITY ? 0.0f : s * expf(m - row), red)};
}

// d[j] = exp(x[j] - m) * scale (minus dloss at `local`) for j < real, 0 up to cols.
template <typename T, int W>
__device__ void write_grad(T* d, const T* x, int real, int cols, float m, float scale, int local,
                           float dloss) {
  for (int j = threadIdx.x * W; j < cols; j += blockDim.x * W) {
    Pack<T, W> p;
    if (j < real) p = load_pack<W>(x + j);
    Pack<T, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float g = 0.0f;
      if (j + k < real) {
        g = expf(to_f32(p.v[k]) - m) * scale;
        if (j + k == local) g -= dloss;
      }
      r.v[k] = from_f32<T>(g);
    }
    store_pack<W>(d + j, r);
  }
}

// dloss / sum rounded once, as the CPU does it.
__device__ __forceinline__ float grad_scale(float dloss, double sum) {
  return static_cast<float>(static_cast<double>(dloss) / sum);
}

template <typename T, int W>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const T* logits,
                                     const int32_t* targets, int V, int Vp, float dloss) {
  __shared__ float red[32];
  const std::size_t off = static_cast<std::size_t>(blockIdx.x) * Vp;
  const T* x = logits + off;
  const int target = targets[blockIdx.x];
  const bool valid = target >= 0 && target < V;
  const float xt = valid ? to_f32(x[target]) : NAN;  // read before anything is written
  const float2 stats = row_max_and_exp_sum<T, W>(x, V, red);  // ends with a barrier
  const float m = stats.x, sum = stats.y;
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) - (xt - m);  // NaN for a bad target
  if (dlogits != nullptr)
    write_grad<T, W>(dlogits + off, x, V, Vp, m, grad_scale(dloss, sum), target, dloss);
}

// The real (unpadded) columns of a shard: its local columns [0, real).
__device__ __forceinline__ int real_columns(int Vl, int col_begin, int V) {
  return max(0, min(Vl, V - col_begin));
}

// Phase 1: the shard's largest value, and its sum of exponentials scaled to it, kept in
// stats (stats[2n] the sum, stats[2n+1] the largest value) for phase 2.
template <typename T, int W>
__global__ void ce_row_max_kernel(float* rowmax, float* stats, const T* logits, int Vl,
                                  int col_begin, int V) {
  __shared__ float red[32];
  const int n = blockIdx.x;
  const T* x = logits + static_cast<std::size_t>(n) * Vl;
  const float2 r = row_max_and_exp_sum<T, W>(x, real_columns(Vl, col_begin, V), red);
  if (threadIdx.x != 0) return;
  rowmax[n] = r.x;
  stats[2 * n] = r.y;
  stats[2 * n + 1] = r.x;
}

// Phase 2, a thread a row: the shard's sum scaled to the row's max over all shards (a
// shard without real columns has sum 0 and largest value -inf: 0 x 0), and the target's
// logit where this shard holds it.
template <typename T>
__global__ void ce_partial_sums_kernel(float* stats, const T* logits, const float* rowmax,
                                       const int32_t* targets, int N, int Vl, int col_begin,
                                       int V) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int real = real_columns(Vl, col_begin, V);
  const float sum = stats[2 * n] * expf(stats[2 * n + 1] - rowmax[n]);
  const int target = targets[n];
  const int local = target - col_begin;
  float tl = local >= 0 && local < real ? to_f32(logits[static_cast<std::size_t>(n) * Vl + local])
                                        : 0.0f;
  if (target < 0 || target >= V) tl = NAN;  // a bad target poisons the loss
  stats[2 * n] = sum;
  stats[2 * n + 1] = tl;
}

template <typename T, int W>
__global__ void ce_finish_kernel(float* losses, T* dlogits, const T* logits, const float* rowmax,
                                 const float* stats, const int32_t* targets, int Vl, int col_begin,
                                 int V, float dloss) {
  const int n = blockIdx.x;
  const double sum = stats[2 * n];
  const float m = rowmax[n];
  if (threadIdx.x == 0)
    losses[n] = static_cast<float>(log(sum) + static_cast<double>(m) - double(stats[2 * n + 1]));
  if (dlogits == nullptr) return;
  const std::size_t off = static_cast<std::size_t>(n) * Vl;
  write_grad<T, W>(dlogits + off, logits + off, real_columns(Vl, col_begin, V), Vl, m,
                   grad_scale(dloss, sum), targets[n] - col_begin, dloss);
}

// W-wide packs when every row is 16-byte aligned.
template <typename T>
bool wide_rows(int cols, std::initializer_list<const void*> ptrs) {
  return cols % kVec<T> == 0 && aligned16(ptrs);
}

void check_shard(const char* op, int N, int Vl, int col_begin, int V) {
  PPTRAIN_CHECK(N >= 0 && Vl >= 0 && col_begin >= 0, std::string(op) + ": negative size");
  PPTRAIN_CHECK(V > 0, std::string(op) + ": V must be positive");
}

}  // namespace

template <typename T>
void cross_entropy(float* losses, T* dlogits, const T* logits, const int32_t* targets, int N, int V,
                   int Vp, float dloss, cudaStream_t s) {
  PPTRAIN_CHECK(N >= 0, "cross_entropy: negative size");
  PPTRAIN_CHECK(V > 0 && V <= Vp, "cross_entropy: need 0 < V <= Vp");
  if (N == 0) return;
  PPTRAIN_CHECK(losses && logits && targets, "cross_entropy: null pointer");
  constexpr int W = kVec<T>;
  if (wide_rows<T>(Vp, {dlogits, logits}))
    cross_entropy_kernel<T, W>
        <<<N, kThreads, 0, s>>>(losses, dlogits, logits, targets, V, Vp, dloss);
  else
    cross_entropy_kernel<T, 1>
        <<<N, kThreads, 0, s>>>(losses, dlogits, logits, targets, V, Vp, dloss);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void ce_row_max(float* rowmax, float* stats, const T* logits, int N, int Vl, int col_begin, int V,
                cudaStream_t s) {
  check_shard("ce_row_max", N, Vl, col_begin, V);
  if (N == 0) return;
  PPTRAIN_CHECK(rowmax && stats && (logits || Vl == 0), "ce_row_max: null pointer");
  constexpr int W = kVec<T>;
  if (wide_rows<T>(Vl, {logits}))
    ce_row_max_kernel<T, W><<<N, kThreads, 0, s>>>(rowmax, stats, logits, Vl, col_begin, V);
  else
    ce_row_max_kernel<T, 1><<<N, kThreads, 0, s>>>(rowmax, stats, logits, Vl, col_begin, V);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void ce_partial_sums(float* stats, const T* logits, const float* rowmax, const int32_t* targets,
                     int N, int Vl, int col_begin, int V, cudaStream_t s) {
  check_shard("ce_partial_sums", N, Vl, col_begin, V);
  if (N == 0) return;
  PPTRAIN_CHECK(stats && rowmax && targets && (logits || Vl == 0), "ce_partial_sums: null pointer");
  constexpr int kRowThreads = 256;
  ce_partial_sums_kernel<T><<<(N + kRowThreads - 1) / kRowThreads, kRowThreads, 0, s>>>(
      stats, logits, rowmax, targets, N, Vl, col_begin, V);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void ce_finish(float* losses, T* dlogits, const T* logits, const float* rowmax, const float* stats,
               const int32_t* targets, int N, int Vl, int col_begin, int V, float dloss,
               cudaStream_t s) {
  check_shard("ce_finish", N, Vl, col_begin, V);
  if (N == 0) return;
  PPTRAIN_CHECK(losses && rowmax && stats && targets, "ce_finish: null pointer");
  PPTRAIN_CHECK(dlogits == nullptr || logits || Vl == 0, "ce_finish: null logits");
  constexpr int W = kVec<T>;
  const int threads = dlogits != nullptr ? kThreads : 32;  // the loss alone needs one thread
  if (wide_rows<T>(Vl, {dlogits, logits}))
    ce_finish_kernel<T, W><<<N, threads, 0, s>>>(losses, dlogits, logits, rowmax, stats, targets,
                                                 Vl, col_begin, V, dloss);
  else
    ce_finish_kernel<T, 1><<<N, threads, 0, s>>>(losses, dlogits, logits, rowmax, stats, targets,
                                                 Vl, col_begin, V, dloss);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

#define PPTRAIN_INSTANTIATE(T)                                                                    \
  template void cross_entropy<T>(float*, T*, const T*, const int32_t*, int, int, int, float,      \
                                 cudaStream_t);                                                   \
  template void ce_row_max<T>(float*, float*, const T*, int, int, int, int, cudaStream_t);       \
  template void ce_partial_sums<T>(float*, const T*, const float*, const int32_t*, int, int, int, \
                                   int, cudaStream_t);                                            \
  template void ce_finish<T>(float*, T*, const T*, const float*, const float*, const int32_t*,    \
                             int, int, int, int, float, cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
