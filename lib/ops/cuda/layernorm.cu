// LayerNorm CUDA kernels (eps 1e-5, biased variance): forward and input gradient with
// one warp per row and fp32 statistics (two passes over the row for the variance),
// weight and bias gradients as deterministic two-pass column sums; or the input gradient
// and the weight and bias gradients' partial sums in one pass over the rows.
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps: 8 rows per block
constexpr int kRowsPerBlock = kThreads / 32;
constexpr float kEps = 1e-5f;

// The row handled by this warp (the same for all its lanes), or -1.
__device__ __forceinline__ int warp_row(int N) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  return row < N ? row : -1;
}

// W-wide packs: C % W == 0 and all rows 16-byte aligned (W = 1 otherwise).
template <typename T, int W>
__global__ void layernorm_forward_kernel(T* out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* inp, const T* __restrict__ w,
                                         const T* __restrict__ b, int N, int C) {
  const int row = warp_row(N);
  if (row < 0) return;  // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const T* x = inp + off;
  float sum = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    const Pack<T, W> p = load_pack<W>(x + c);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += to_f32(p.v[k]);
  }
  const float m = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    const Pack<T, W> p = load_pack<W>(x + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float d = to_f32(p.v[k]) - m;
      sq += d * d;
    }
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / C + kEps);
  T* o = out + off;
  for (int c = lane * W; c < C; c += 32 * W) {
    const Pack<T, W> p = load_pack<W>(x + c), pw = load_pack<W>(w + c), pb = load_pack<W>(b + c);
    Pack<T, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k)
      r.v[k] = from_f32<T>((to_f32(p.v[k]) - m) * rs * to_f32(pw.v[k]) + to_f32(pb.v[k]));
    store_pack<W>(o + c, r);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// One row's input gradient, by its warp: dinp = dres + rstd * (g - mean(g) - xhat *
// mean(g * xhat)) with g = dout * w (dres may be dinp). With kSums, each lane also adds
// its columns' dout * xhat to sum_w and dout to sum_b.
template <typename T, int W, bool kSums>
__device__ __forceinline__ void layernorm_backward_row(T* dinp, const T* dres, const T* dout,
                                                       const T* inp, const T* w, float m,
                                                       float rs, int C, float* sum_w,
                                                       float* sum_b) {
  const int lane = threadIdx.x % 32;
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    const Pack<T, W> px = load_pack<W>(inp + c), pd = load_pack<W>(dout + c),
                     pw = load_pack<W>(w + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float g = to_f32(pd.v[k]) * to_f32(pw.v[k]);
      sum_g += g;
      sum_gx += g * ((to_f32(px.v[k]) - m) * rs);
    }
  }
  const float mean_g = warp_sum(sum_g) / C;
  const float mean_gx = warp_sum(sum_gx) / C;
  for (int c = lane * W; c < C; c += 32 * W) {
    const Pack<T, W> px = load_pack<W>(inp + c), pd = load_pack<W>(dout + c),
                     pw = load_pack<W>(w + c);
    Pack<T, W> r = load_pack<W>(dres + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float xhat = (to_f32(px.v[k]) - m) * rs;
      const float d = to_f32(pd.v[k]);
      const float g = d * to_f32(pw.v[k]);
      r.v[k] = from_f32<T>(to_f32(r.v[k]) + rs * (g - mean_g - xhat * mean_gx));
      if constexpr (kSums) {
        sum_w[c + k] += d * xhat;
        sum_b[c + k] += d;
      }
    }
    store_pack<W>(dinp + c, r);
  }
}

template <typename T, int W>
__global__ void layernorm_backward_input_kernel(T* dinp, const T* dres, const T* dout,
                                                const T* __restrict__ inp,
                                                const T* __restrict__ w,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ rstd, int N, int C) {
  const int row = warp_row(N);
  if (row < 0) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  layernorm_backward_row<T, W, false>(dinp + off, dres + off, dout + off, inp + off, w, mean[row],
                                      rstd[row], C, nullptr, nullptr);
}

// Pass 1 of the weight gradient: for this block's 32 columns and chunk of rows,
// part_w[chunk, c] = sum dout * xhat and part_b[chunk, c] = sum dout.
// Block (32, 8): x over columns, y strides over the chunk's rows.
template <typename T>
__global__ void layernorm_weight_partial_kernel(float* __restrict__ part_w,
                                                float* __restrict__ part_b,
                                                const T* __restrict__ dout,
                                                const T* __restrict__ inp,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ rstd, int N, int C) {
  __shared__ float tile_w[8][33];
  __shared__ float tile_b[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * kColumnSumRows;
  const int r1 = min(N, r0 + kColumnSumRows);
  float acc_w = 0.0f, acc_b = 0.0f;
  if (c < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      const std::size_t i = static_cast<std::size_t>(r) * C + c;
      const float d = to_f32(dout[i]);
      acc_w += d * ((to_f32(inp[i]) - mean[r]) * rstd[r]);
      acc_b += d;
    }
  }
  tile_w[threadIdx.y][threadIdx.x] = acc_w;
  tile_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float sum_w = 0.0f, sum_b = 0.0f;
  for (int k = 0; k < 8; ++k) {
    sum_w += tile_w[k][threadIdx.x];
    sum_b += tile_b[k][threadIdx.x];
  }
  const std::size_t o = static_cast<std::size_t>(blockIdx.y) * C + c;
  part_w[o] = sum_w;
  part_b[o] = sum_b;
}

// The input gradient (as layernorm_backward_input_kernel) with pass 1 of the weight and
// bias gradients (as layernorm_weight_partial_kernel) in one pass: block b takes chunk b
// of kColumnSumRows rows, and its warp w the chunk's rows w, w + 8, ..., as the partial
// kernel's thread row w does. Each lane adds its columns' dout * xhat and dout into its
// warp's own rows of shared memory while it writes the input gradient; then the warps'
// sums are added in warp order. The same operations in the same order: both outputs are
// bit-identical to the two kernels'. Shared memory: 8 warps x 2 x C floats.
template <typename T, int W>
__global__ void layernorm_backward_kernel(T* dinp, const T* dres, const T* dout,
                                          const T* __restrict__ inp, const T* __restrict__ w,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd,
                                          float* __restrict__ part_w, float* __restrict__ part_b,
                                          int N, int C) {
  extern __shared__ float sums[];  // [warp][dout * xhat, then dout][C]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* sum_w = sums + static_cast<std::size_t>(warp) * 2 * C;
  float* sum_b = sum_w + C;
  for (int c = lane * W; c < C; c += 32 * W)  // a lane's own columns: no other thread's
#pragma unroll
    for (int k = 0; k < W; ++k) sum_w[c + k] = sum_b[c + k] = 0.0f;
  const int r0 = static_cast<int>(blockIdx.x) * kColumnSumRows;
  const int r1 = min(N, r0 + kColumnSumRows);
  for (int row = r0 + warp; row < r1; row += kRowsPerBlock) {
    const std::size_t off = static_cast<std::size_t>(row) * C;
    layernorm_backward_row<T, W, true>(dinp + off, dres + off, dout + off, inp + off, w,
                                       mean[row], rstd[row], C, sum_w, sum_b);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float total_w = 0.0f, total_b = 0.0f;
    for (int k = 0; k < kRowsPerBlock; ++k) {
      total_w += sums[static_cast<std::size_t>(k) * 2 * C + c];
      total_b += sums[static_cast<std::size_t>(k) * 2 * C + C + c];
    }
    const std::size_t o = static_cast<std::size_t>(blockIdx.x) * C + c;
    part_w[o] = total_w;
    part_b[o] = total_b;
  }
}

void check_sizes(const char* op, int N, int C) {
  PPTRAIN_CHECK(N >= 0 && C >= 0, std::string(op) + ": negative size");
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                       int N, int C, cudaStream_t s) {
  check_sizes("layernorm_forward", N, C);
  if (N == 0) return;
  PPTRAIN_CHECK(C > 0, "layernorm_forward: C must be positive");
  PPTRAIN_CHECK(out && mean && rstd && inp && w && b, "layernorm_forward: null pointer");
  const unsigned grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  constexpr int V = kVec<T>;
  if (C % V == 0 && aligned16({out, inp, w, b}))
    layernorm_forward_kernel<T, V><<<grid, kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
  else
    layernorm_forward_kernel<T, 1><<<grid, kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void layernorm_backward_input(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                              const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
  check_sizes("layernorm_backward_input", N, C);
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(dinp && dresidual && dout && inp && w && mean && rstd,
                "layernorm_backward_input: null pointer");
  const unsigned grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  constexpr int V = kVec<T>;
  if (C % V == 0 && aligned16({dinp, dresidual, dout, inp, w}))
    layernorm_backward_input_kernel<T, V>
        <<<grid, kThreads, 0, s>>>(dinp, dresidual, dout, inp, w, mean, rstd, N, C);
  else
    layernorm_backward_input_kernel<T, 1>
        <<<grid, kThreads, 0, s>>>(dinp, dresidual, dout, inp, w, mean, rstd, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

std::size_t layernorm_backward_weight_scratch_floats(int N, int C) {
  return 2 * cuda_column_sum_floats(N, C);  // weight and bias
}

template <typename T>
void layernorm_backward_weight(float* dw, float* db, const T* dout, const T* inp, const float* mean,
                               const float* rstd, int N, int C, float* scratch, cudaStream_t s) {
  check_sizes("layernorm_backward_weight", N, C);
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(dw && db && dout && inp && mean && rstd && scratch,
                "layernorm_backward_weight: null pointer");
  const int chunks = column_sum_chunks(N);
  PPTRAIN_CHECK(chunks <= 65535, "layernorm_backward_weight: too many rows");
  float* part_w = scratch;
  float* part_b = scratch + static_cast<std::size_t>(chunks) * C;
  layernorm_weight_partial_kernel<T><<<dim3((C + 31) / 32, chunks), dim3(32, 8), 0, s>>>(
      part_w, part_b, dout, inp, mean, rstd, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  column_sum_finish_pair<<<dim3((C + kThreads - 1) / kThreads, 2), kThreads, 0, s>>>(
      dw, part_w, db, part_b, chunks, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

std::size_t layernorm_backward_shared_bytes(int C) {
  return std::size_t(kRowsPerBlock) * 2 * std::size_t(C) * sizeof(float);
}

template <typename T>
void layernorm_backward(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                        const float* mean, const float* rstd, float* dw, float* db, int N, int C,
                        float* scratch, int max_shared, cudaStream_t s) {
  check_sizes("layernorm_backward", N, C);
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(dinp && dresidual && dout && inp && w && mean && rstd && dw && db && scratch,
                "layernorm_backward: null pointer");
  const std::size_t shared = layernorm_backward_shared_bytes(C);
  PPTRAIN_CHECK(shared <= std::size_t(max_shared), "layernorm_backward: C too large");
  const int chunks = column_sum_chunks(N);
  float* part_w = scratch;
  float* part_b = scratch + static_cast<std::size_t>(chunks) * C;
  constexpr int V = kVec<T>;
  auto launch = [&](auto kernel) {
    allow_smem(kernel, std::size_t(max_shared));
    kernel<<<chunks, kThreads, shared, s>>>(dinp, dresidual, dout, inp, w, mean, rstd, part_w,
                                            part_b, N, C);
  };
  if (C % V == 0 && aligned16({dinp, dresidual, dout, inp, w}))
    launch(layernorm_backward_kernel<T, V>);
  else
    launch(layernorm_backward_kernel<T, 1>);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  column_sum_finish_pair<<<dim3((C + kThreads - 1) / kThreads, 2), kThreads, 0, s>>>(
      dw, part_w, db, part_b, chunks, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

#define PPTRAIN_INSTANTIATE(T)                                                                   \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, \
                                     cudaStream_t);                                              \
  template void layernorm_backward_input<T>(T*, const T*, const T*, const T*, const T*,          \
                                            const float*, const float*, int, int, cudaStream_t);  \
  template void layernorm_backward_weight<T>(float*, float*, const T*, const T*, const float*,   \
                                             const float*, int, int, float*, cudaStream_t);      \
  template void layernorm_backward<T>(T*, const T*, const T*, const T*, const T*, const float*, \
                                      const float*, float*, float*, int, int, float*, int,      \
                                      cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
