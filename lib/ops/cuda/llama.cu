// The Llama-family block kernels: RMSNorm (a warp per row; the weight gradient by the
// deterministic two-pass column sums), SwiGLU and the rotary embedding (a thread per
// element, or per rotated pair). Arithmetic in fp32.
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // a warp per row

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* w, int N, int C,
                                       float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;  // the whole warp
  const T* x = inp + static_cast<std::size_t>(row) * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = to_f32(x[c]);
    sq += v * v;
  }
  sq = warp_sum(sq);
  const float r = 1.0f / sqrtf(sq / static_cast<float>(C) + eps);
  T* o = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = from_f32<T>(to_f32(x[c]) * r * to_f32(w[c]));
  if (lane == 0) rstd[row] = r;
}

// One row's input gradient, by its warp: dinp = dres + r (g - x r^2 mean(g x)), g = dout
// * w (dres may be dinp). With kSums each lane also adds its columns' dout * (x r) to sum_w.
template <typename T, bool kSums>
__device__ __forceinline__ void rmsnorm_backward_row(T* dinp, const T* dres, const T* dout,
                                                     const T* inp, const T* w, float r, int C,
                                                     float* sum_w) {
  const int lane = threadIdx.x % 32;
  float gx = 0.0f;
  for (int c = lane; c < C; c += 32) gx += to_f32(dout[c]) * to_f32(w[c]) * to_f32(inp[c]);
  gx = warp_sum(gx);
  const float k = gx / static_cast<float>(C) * r * r;
  for (int c = lane; c < C; c += 32) {
    const float d = to_f32(dout[c]), x = to_f32(inp[c]);
    dinp[c] = from_f32<T>(to_f32(dres[c]) + r * (d * to_f32(w[c]) - x * k));
    if constexpr (kSums) sum_w[c] += d * (x * r);
  }
}

template <typename T>
__global__ void rmsnorm_backward_input_kernel(T* dinp, const T* dres, const T* dout, const T* inp,
                                              const T* w, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  rmsnorm_backward_row<T, false>(dinp + off, dres + off, dout + off, inp + off, w, rstd[row], C,
                                 nullptr);
}

// Pass 1 of the weight gradient: part[chunk, c] = sum over the chunk's rows of dout * (inp
// * rstd). Block (32, 8): x over 32 columns, thread row y adds rows y, y + 8, ... of the
// chunk; then the 8 sums are added in order.
template <typename T>
__global__ void rmsnorm_weight_partial_kernel(float* part, const T* dout, const T* inp,
                                              const float* rstd, int N, int C) {
  __shared__ float tile[kRowsPerBlock][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * kColumnSumRows, r1 = min(N, r0 + kColumnSumRows);
  float acc = 0.0f;
  if (c < C)
    for (int r = r0 + threadIdx.y; r < r1; r += kRowsPerBlock) {
      const std::size_t i = static_cast<std::size_t>(r) * C + c;
      acc += to_f32(dout[i]) * (to_f32(inp[i]) * rstd[r]);
    }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float sum = 0.0f;
  for (int k = 0; k < kRowsPerBlock; ++k) sum += tile[k][threadIdx.x];
  part[static_cast<std::size_t>(blockIdx.y) * C + c] = sum;
}

// The input gradient with pass 1 of the weight gradient, in one pass: block b takes chunk
// b of kColumnSumRows rows and its warp w the chunk's rows w, w + 8, ..., as the partial
// kernel's thread row w does; each lane adds its columns into its warp's row of shared
// memory, then the warps' sums are added in warp order. The same operations in the same
// order: bit-identical to the two kernels. Shared memory: 8 warps x C floats.
template <typename T>
__global__ void rmsnorm_backward_kernel(T* dinp, const T* dres, const T* dout, const T* inp,
                                        const T* w, const float* rstd, float* part, int N, int C) {
  extern __shared__ float sums[];  // [warp][C]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* sum_w = sums + static_cast<std::size_t>(warp) * C;
  for (int c = lane; c < C; c += 32) sum_w[c] = 0.0f;  // a lane's own columns
  const int r0 = static_cast<int>(blockIdx.x) * kColumnSumRows, r1 = min(N, r0 + kColumnSumRows);
  for (int row = r0 + warp; row < r1; row += kRowsPerBlock) {
    const std::size_t off = static_cast<std::size_t>(row) * C;
    rmsnorm_backward_row<T, true>(dinp + off, dres + off, dout + off, inp + off, w, rstd[row], C,
                                  sum_w);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float total = 0.0f;
    for (int k = 0; k < kRowsPerBlock; ++k) total += sums[static_cast<std::size_t>(k) * C + c];
    part[static_cast<std::size_t>(blockIdx.x) * C + c] = total;
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int N, int F) {
  const std::size_t n_all = static_cast<std::size_t>(N) * F;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n_all;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t n = i / F, f = i % F;
    const T* row = gate_up + n * 2 * F;
    const float g = to_f32(row[f]), u = to_f32(row[F + f]);
    out[i] = from_f32<T>(g * sigmoid(g) * u);
  }
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
template <typename T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int N, int F) {
  const std::size_t n_all = static_cast<std::size_t>(N) * F;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n_all;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t n = i / F, f = i % F, row = n * 2 * F;
    const float g = to_f32(gate_up[row + f]), u = to_f32(gate_up[row + F + f]);
    const float d = to_f32(dout[i]), s = sigmoid(g);
    dgate_up[row + F + f] = from_f32<T>(d * g * s);
    dgate_up[row + f] = from_f32<T>(d * u * s * (1.0f + g * (1.0f - s)));
  }
}

// One thread per (row, head, pair).
template <typename T>
__global__ void rope_kernel(T* x, int N, int T_, int stride, int heads, int head_size,
                            float theta, bool inverse, int first) {
  const int half = head_size / 2;
  const std::size_t n_all = static_cast<std::size_t>(N) * heads * half;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n_all;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(i % half);
    const std::size_t head = i / half;
    const int h = static_cast<int>(head % heads), n = static_cast<int>(head / heads);
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * p) / static_cast<float>(head_size));
    const float a = static_cast<float>(first + n % T_) * inv_freq;
    const float c = cosf(a), s = inverse ? -sinf(a) : sinf(a);
    T* v = x + static_cast<std::size_t>(n) * stride + static_cast<std::size_t>(h) * head_size;
    const float x1 = to_f32(v[p]), x2 = to_f32(v[p + half]);
    v[p] = from_f32<T>(x1 * c - x2 * s);
    v[p + half] = from_f32<T>(x2 * c + x1 * s);
  }
}

void check_rows(const char* op, int N, int C) {
  PPTRAIN_CHECK(N >= 0 && C >= 0, std::string(op) + ": negative size");
}

}  // namespace

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* w, int N, int C, float eps,
                     cudaStream_t s) {
  check_rows("rmsnorm_forward", N, C);
  if (N == 0) return;
  PPTRAIN_CHECK(C > 0, "rmsnorm_forward: C must be positive");
  PPTRAIN_CHECK(out && rstd && inp && w, "rmsnorm_forward: null pointer");
  rmsnorm_forward_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(
      out, rstd, inp, w, N, C, eps);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rmsnorm_backward_input(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                            const float* rstd, int N, int C, cudaStream_t s) {
  check_rows("rmsnorm_backward_input", N, C);
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(dinp && dresidual && dout && inp && w && rstd,
                "rmsnorm_backward_input: null pointer");
  rmsnorm_backward_input_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(
      dinp, dresidual, dout, inp, w, rstd, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

std::size_t rmsnorm_backward_weight_scratch_floats(int N, int C) {
  return cuda_column_sum_floats(N, C);
}

template <typename T>
void rmsnorm_backward_weight(float* dw, const T* dout, const T* inp, const float* rstd, int N,
                             int C, float* scratch, cudaStream_t s) {
  check_rows("rmsnorm_backward_weight", N, C);
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(dw && dout && inp && rstd && scratch, "rmsnorm_backward_weight: null pointer");
  const int chunks = column_sum_chunks(N);
  PPTRAIN_CHECK(chunks <= 65535, "rmsnorm_backward_weight: too many rows");
  rmsnorm_weight_partial_kernel<T><<<dim3((C + 31) / 32, chunks), dim3(32, kRowsPerBlock), 0, s>>>(
      scratch, dout, inp, rstd, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  column_sum_finish<<<(C + kThreads - 1) / kThreads, kThreads, 0, s>>>(dw, scratch, chunks, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

std::size_t rmsnorm_backward_shared_bytes(int C) {
  return std::size_t(kRowsPerBlock) * std::size_t(C) * sizeof(float);
}

template <typename T>
void rmsnorm_backward(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                      const float* rstd, float* dw, int N, int C, float* scratch, int max_shared,
                      cudaStream_t s) {
  check_rows("rmsnorm_backward", N, C);
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(dinp && dresidual && dout && inp && w && rstd && dw && scratch,
                "rmsnorm_backward: null pointer");
  const std::size_t shared = rmsnorm_backward_shared_bytes(C);
  PPTRAIN_CHECK(shared <= std::size_t(max_shared), "rmsnorm_backward: C too large");
  const int chunks = column_sum_chunks(N);
  allow_smem(rmsnorm_backward_kernel<T>, std::size_t(max_shared));
  rmsnorm_backward_kernel<T><<<chunks, kThreads, shared, s>>>(dinp, dresidual, dout, inp, w, rstd,
                                                              scratch, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  column_sum_finish<<<(C + kThreads - 1) / kThreads, kThreads, 0, s>>>(dw, scratch, chunks, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int N, int F, cudaStream_t s) {
  check_rows("swiglu_forward", N, F);
  if (N == 0 || F == 0) return;
  PPTRAIN_CHECK(out && gate_up, "swiglu_forward: null pointer");
  swiglu_forward_kernel<T><<<grid_for(std::size_t(N) * F, kThreads), kThreads, 0, s>>>(out, gate_up,
                                                                                       N, F);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int N, int F, cudaStream_t s) {
  check_rows("swiglu_backward", N, F);
  if (N == 0 || F == 0) return;
  PPTRAIN_CHECK(dgate_up && dout && gate_up, "swiglu_backward: null pointer");
  swiglu_backward_kernel<T><<<grid_for(std::size_t(N) * F, kThreads), kThreads, 0, s>>>(
      dgate_up, dout, gate_up, N, F);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rope(T* x, int N, int T_, int stride, int heads, int head_size, float theta, bool inverse,
          int first, cudaStream_t s) {
  check_rows("rope", N, heads);
  PPTRAIN_CHECK(head_size > 0 && head_size % 2 == 0 && T_ > 0 && stride >= heads * head_size,
                "rope: needs an even head size, T > 0 and the heads inside the row");
  PPTRAIN_CHECK(first >= 0, "rope: a negative first position");
  if (N == 0 || heads == 0) return;
  PPTRAIN_CHECK(x != nullptr, "rope: null pointer");
  const std::size_t pairs = std::size_t(N) * heads * (head_size / 2);
  rope_kernel<T><<<grid_for(pairs, kThreads), kThreads, 0, s>>>(x, N, T_, stride, heads, head_size,
                                                                theta, inverse, first);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

#define PPTRAIN_INSTANTIATE(T)                                                                  \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float,             \
                                   cudaStream_t);                                               \
  template void rmsnorm_backward_input<T>(T*, const T*, const T*, const T*, const T*,            \
                                          const float*, int, int, cudaStream_t);                \
  template void rmsnorm_backward_weight<T>(float*, const T*, const T*, const float*, int, int,  \
                                           float*, cudaStream_t);                               \
  template void rmsnorm_backward<T>(T*, const T*, const T*, const T*, const T*, const float*,   \
                                    float*, int, int, float*, int, cudaStream_t);               \
  template void swiglu_forward<T>(T*, const T*, int, int, cudaStream_t);                        \
  template void swiglu_backward<T>(T*, const T*, const T*, int, int, cudaStream_t);             \
  template void rope<T>(T*, int, int, int, int, int, float, bool, int, cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
