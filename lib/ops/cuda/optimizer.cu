// AdamW update (fp32 master weights and state, optional compute-dtype weight copy), the
// deterministic fp64 sums of the gradient norm and the loss, and the update's control.
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSumBlocks = kCudaSumSquaresPartials;  // most partial sums of sum_squares

struct AdamWArgs {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, inv_bc1, inv_bc2,
      grad_scale;
};

// The CPU AdamW's operations in its order; the _rn intrinsics keep the compiler from
// fusing multiplies and adds, so each step rounds as it does on the CPU:
//   g = grad * grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*(g*g);
//   p -= lr * ((m*inv_bc1) / (sqrt(v*inv_bc2) + eps) + wd*p).
template <typename T, int W>
__global__ void adamw_kernel(float* __restrict__ params, T* weights,
                             const float* __restrict__ grads, float* __restrict__ m,
                             float* __restrict__ v, std::size_t n, AdamWArgs h,
                             const float* control) {
  if (control != nullptr) {
    if (control[1] == 0.0f) return;
    h.grad_scale = control[0];
  }
  for_each_pack<W>(n, [=](std::size_t i, auto w) {
    constexpr int M = decltype(w)::value;
    Pack<float, M> p = load_pack<M>(params + i), mi = load_pack<M>(m + i), vi = load_pack<M>(v + i);
    const Pack<float, M> gi = load_pack<M>(grads + i);
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
                                   __fmul_rn(h.weight_decay, p.v[k]));
      p.v[k] = __fsub_rn(p.v[k], __fmul_rn(h.lr, step));
      out.v[k] = from_f32<T>(p.v[k]);
    }
    store_pack<M>(params + i, p);
    store_pack<M>(m + i, mi);
    store_pack<M>(v + i, vi);
    if (weights != nullptr) store_pack<M>(weights + i, out);
  });
}

// part[block] = sum of x[i]^2 in fp64 over this block's grid-stride share of [0, n).
__global__ void sum_squares_partial_kernel(double* __restrict__ part, const float* __restrict__ x,
                                           std::size_t n) {
  __shared__ double red[32];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double d = x[i];
    acc += d * d;
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
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

// *out = x[0] + ... + x[n-1] in order: one thread.
__global__ void sum_in_order_kernel(double* __restrict__ out, const double* __restrict__ x, int n) {
  double acc = x[0];
  for (int i = 1; i < n; ++i) acc += x[i];
  *out = acc;
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

void sum_in_order(double* out, const double* x, int n, cudaStream_t s) {
  PPTRAIN_CHECK(out && x && n >= 1, "sum_in_order: bad arguments");
  sum_in_order_kernel<<<1, 1, 0, s>>>(out, x, n);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

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
void adamw(float* params, T* weights, const float* grads, float* m, float* v, std::size_t n,
           float lr, float beta1, float beta2, float one_minus_beta1, float one_minus_beta2,
           float eps, float weight_decay, float inv_bc1, float inv_bc2, float grad_scale,
           const float* control, cudaStream_t s) {
  if (n == 0) return;
  PPTRAIN_CHECK(params && grads && m && v, "adamw: null pointer");
  const AdamWArgs h{lr,  beta1,        beta2,   one_minus_beta1, one_minus_beta2,
                    eps, weight_decay, inv_bc1, inv_bc2,         grad_scale};
  if (aligned16({params, weights, grads, m, v}))
    adamw_kernel<T, 4>
        <<<grid_for((n + 3) / 4, kThreads), kThreads, 0, s>>>(params, weights, grads, m, v, n, h,
                                                              control);
  else
    adamw_kernel<T, 1>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(params, weights, grads, m, v, n, h, control);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

std::size_t sum_squares_scratch_doubles() { return kSumBlocks; }

void sum_squares(double* out, const float* x, std::size_t n, double* scratch, cudaStream_t s) {
  PPTRAIN_CHECK(out != nullptr, "sum_squares: null pointer");
  if (n == 0) {
    PPTRAIN_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  PPTRAIN_CHECK(x && scratch, "sum_squares: null pointer");
  // The block count depends only on n, so the summation order is fixed for a given n.
  const std::size_t want = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < kSumBlocks ? want : kSumBlocks);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(scratch, x, n);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kThreads, 0, s>>>(out, scratch, blocks);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

#define PPTRAIN_INSTANTIATE(T)                                                                \
  template void adamw<T>(float*, T*, const float*, float*, float*, std::size_t, float, float, \
                         float, float, float, float, float, float, float, float, const float*,    \
                         cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
