// Elementwise CUDA kernels: add, the bias add and its (deterministic)
// gradient, GELU (tanh form with GPT-2's constants) forward and backward, and the
// fp32 <-> compute-dtype casts. Arithmetic in fp32; 16-byte packs when aligned.
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 256;
// GELU's tanh form, 0.5 x (1 + tanh u) with u = sqrt(2 / pi) (x + 0.044715 x^3), is
// x sigmoid(2u); computed from e = exp(-|2u|), as the CPU backend does, so that no
// 1 + tanh cancels where u is negative.
constexpr float kGeluTwoScale = 2.0f * 0.7978845608028654f;  // 2u = x (a + b x^2)
constexpr float kGeluTwoScaleCubic = kGeluTwoScale * 0.044715f;

template <typename T, int W>
__global__ void add_kernel(T* out, const T* a, const T* b, std::size_t n) {
  for_each_pack<W>(n, [=](std::size_t i, auto w) {
    constexpr int M = decltype(w)::value;
    const Pack<T, M> x = load_pack<M>(a + i), y = load_pack<M>(b + i);
    Pack<T, M> r;
#pragma unroll
    for (int k = 0; k < M; ++k) r.v[k] = from_f32<T>(to_f32(x.v[k]) + to_f32(y.v[k]));
    store_pack<M>(out + i, r);
  });
}

// dst[i] = Dst(src[i]): the casts between fp32 and the compute dtype.
template <typename Dst, typename Src, int W>
__global__ void convert_kernel(Dst* dst, const Src* src, std::size_t n) {
  for_each_pack<W>(n, [=](std::size_t i, auto w) {
    constexpr int M = decltype(w)::value;
    const Pack<Src, M> x = load_pack<M>(src + i);
    Pack<Dst, M> r;
#pragma unroll
    for (int k = 0; k < M; ++k) r.v[k] = from_f32<Dst>(to_f32(x.v[k]));
    store_pack<M>(dst + i, r);
  });
}

__device__ __forceinline__ float gelu(float x) {
  const float two_u = x * (kGeluTwoScale + kGeluTwoScaleCubic * x * x);
  const float e = expf(-fabsf(two_u));
  return x * ((two_u < 0.0f ? e : 1.0f) / (1.0f + e));
}

// sigmoid(2u) + x sigmoid'(2u) d(2u)/dx, with sigmoid' = e / (1 + e)^2.
__device__ __forceinline__ float gelu_grad(float x) {
  const float two_u = x * (kGeluTwoScale + kGeluTwoScaleCubic * x * x);
  const float two_du = kGeluTwoScale + 3.0f * kGeluTwoScaleCubic * x * x;
  const float e = expf(-fabsf(two_u));
  const float q = 1.0f / (1.0f + e);
  return (two_u < 0.0f ? e : 1.0f) * q + x * two_du * (e * q * q);
}

template <typename T, int W>
__global__ void gelu_forward_kernel(T* out, const T* inp, std::size_t n) {
  for_each_pack<W>(n, [=](std::size_t i, auto w) {
    constexpr int M = decltype(w)::value;
    const Pack<T, M> x = load_pack<M>(inp + i);
    Pack<T, M> r;
#pragma unroll
    for (int k = 0; k < M; ++k) r.v[k] = from_f32<T>(gelu(to_f32(x.v[k])));
    store_pack<M>(out + i, r);
  });
}

// dinp may alias dout: each element is read before the same thread writes it.
template <typename T, int W>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, std::size_t n) {
  for_each_pack<W>(n, [=](std::size_t i, auto w) {
    constexpr int M = decltype(w)::value;
    const Pack<T, M> x = load_pack<M>(inp + i), d = load_pack<M>(dout + i);
    Pack<T, M> r;
#pragma unroll
    for (int k = 0; k < M; ++k) r.v[k] = from_f32<T>(gelu_grad(to_f32(x.v[k])) * to_f32(d.v[k]));
    store_pack<M>(dinp + i, r);
  });
}

// out[n, c..c+W) += bias[c..c+W): x over column packs, y strides over the rows.
template <typename T, int W>
__global__ void add_bias_kernel(T* out, const T* bias, int N, int C) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (c >= C) return;
  const Pack<T, W> b = load_pack<W>(bias + c);
  for (int n = blockIdx.y; n < N; n += gridDim.y) {
    T* row = out + static_cast<std::size_t>(n) * C + c;
    Pack<T, W> o = load_pack<W>(row);
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = from_f32<T>(to_f32(o.v[k]) + to_f32(b.v[k]));
    store_pack<W>(row, o);
  }
}

// Pass 1 of bias_backward: part[chunk, c] = sum of dout[r, c] over the chunk's rows.
// Block (32, 8): x over 32 columns, y strides over the chunk's rows.
template <typename T>
__global__ void bias_partial_kernel(float* part, const T* dout, int N, int C) {
  __shared__ float tile[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * kColumnSumRows;
  const int r1 = min(N, r0 + kColumnSumRows);
  float acc = 0.0f;
  if (c < C)
    for (int r = r0 + threadIdx.y; r < r1; r += 8)
      acc += to_f32(dout[static_cast<std::size_t>(r) * C + c]);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float sum = 0.0f;
  for (int k = 0; k < 8; ++k) sum += tile[k][threadIdx.x];
  part[static_cast<std::size_t>(blockIdx.y) * C + c] = sum;
}

// Launches a pack kernel with W-wide packs when every pointer is 16-byte aligned,
// element by element otherwise.
template <int W, typename Wide, typename Narrow, typename... Args>
void launch_map(Wide wide, Narrow narrow, std::size_t n, bool aligned, cudaStream_t s,
                Args... args) {
  if (n == 0) return;
  if (aligned)
    wide<<<grid_for((n + W - 1) / W, kThreads), kThreads, 0, s>>>(args..., n);
  else
    narrow<<<grid_for(n, kThreads), kThreads, 0, s>>>(args..., n);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void add(T* out, const T* a, const T* b, std::size_t n, cudaStream_t s) {
  PPTRAIN_CHECK(n == 0 || (out && a && b), "add: null pointer");
  launch_map<kVec<T>>(add_kernel<T, kVec<T>>, add_kernel<T, 1>, n, aligned16({out, a, b}), s, out,
                      a, b);
}

template <typename T>
__global__ void copy_columns_kernel(T* dst, int dst_width, const T* src, int src_width, int rows,
                                    int cols) {
  const std::size_t n = std::size_t(rows) * cols;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / cols, c = i % cols;
    dst[r * dst_width + c] = src[r * src_width + c];
  }
}

template <typename T>
void copy_columns(T* dst, int dst_width, int dst_col, const T* src, int src_width, int src_col,
                  int rows, int cols, cudaStream_t s) {
  PPTRAIN_CHECK(rows >= 0 && cols >= 0 && dst_col >= 0 && src_col >= 0 &&
                    dst_col + cols <= dst_width && src_col + cols <= src_width,
                "copy_columns: columns outside the rows");
  if (rows == 0 || cols == 0) return;
  PPTRAIN_CHECK(dst && src, "copy_columns: null pointer");
  const std::size_t n = std::size_t(rows) * cols;
  copy_columns_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(dst + dst_col, dst_width,
                                                                     src + src_col, src_width,
                                                                     rows, cols);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void add_bias(T* out, const T* bias, int N, int C, cudaStream_t s) {
  PPTRAIN_CHECK(N >= 0 && C >= 0, "add_bias: negative size");
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(out && bias, "add_bias: null pointer");
  constexpr int V = kVec<T>;
  const bool wide = C % V == 0 && aligned16({out, bias});
  const int packs = wide ? C / V : C;
  const int threads = packs >= 256 ? 256 : (packs + 31) / 32 * 32;
  const dim3 grid((packs + threads - 1) / threads, N < 4096 ? N : 4096);
  if (wide)
    add_bias_kernel<T, V><<<grid, threads, 0, s>>>(out, bias, N, C);
  else
    add_bias_kernel<T, 1><<<grid, threads, 0, s>>>(out, bias, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

std::size_t bias_backward_scratch_floats(int N, int C) { return cuda_column_sum_floats(N, C); }

template <typename T>
void bias_backward(float* dbias, const T* dout, int N, int C, float* scratch, cudaStream_t s) {
  PPTRAIN_CHECK(N >= 0 && C >= 0, "bias_backward: negative size");
  if (N == 0 || C == 0) return;
  PPTRAIN_CHECK(dbias && dout && scratch, "bias_backward: null pointer");
  const int chunks = column_sum_chunks(N);
  PPTRAIN_CHECK(chunks <= 65535, "bias_backward: too many rows");
  bias_partial_kernel<T><<<dim3((C + 31) / 32, chunks), dim3(32, 8), 0, s>>>(scratch, dout, N, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  add_column_sums(dbias, scratch, chunks, C, s);
}

void add_column_sums(float* out, const float* part, int chunks, int C, cudaStream_t s) {
  PPTRAIN_CHECK(chunks >= 0 && C >= 0, "add_column_sums: negative size");
  if (chunks == 0 || C == 0) return;
  PPTRAIN_CHECK(out && part, "add_column_sums: null pointer");
  column_sum_finish<<<(C + kThreads - 1) / kThreads, kThreads, 0, s>>>(out, part, chunks, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void gelu_forward(T* out, const T* inp, std::size_t n, cudaStream_t s) {
  PPTRAIN_CHECK(n == 0 || (out && inp), "gelu_forward: null pointer");
  launch_map<kVec<T>>(gelu_forward_kernel<T, kVec<T>>, gelu_forward_kernel<T, 1>, n,
                      aligned16({out, inp}), s, out, inp);
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n, cudaStream_t s) {
  PPTRAIN_CHECK(n == 0 || (dinp && inp && dout), "gelu_backward: null pointer");
  launch_map<kVec<T>>(gelu_backward_kernel<T, kVec<T>>, gelu_backward_kernel<T, 1>, n,
                      aligned16({dinp, inp, dout}), s, dinp, inp, dout);
}

// Mixed-width casts move 4 elements per pack (16 bytes of fp32).
template <typename T>
void to_compute(T* dst, const float* src, std::size_t n, cudaStream_t s) {
  PPTRAIN_CHECK(n == 0 || (dst && src), "to_compute: null pointer");
  launch_map<4>(convert_kernel<T, float, 4>, convert_kernel<T, float, 1>, n, aligned16({dst, src}),
                s, dst, src);
}

template <typename T>
void to_float(float* dst, const T* src, std::size_t n, cudaStream_t s) {
  PPTRAIN_CHECK(n == 0 || (dst && src), "to_float: null pointer");
  launch_map<4>(convert_kernel<float, T, 4>, convert_kernel<float, T, 1>, n, aligned16({dst, src}),
                s, dst, src);
}

#define PPTRAIN_INSTANTIATE(T)                                                       \
  template void add<T>(T*, const T*, const T*, std::size_t, cudaStream_t);           \
  template void add_bias<T>(T*, const T*, int, int, cudaStream_t);                   \
  template void copy_columns<T>(T*, int, int, const T*, int, int, int, int, cudaStream_t); \
  template void bias_backward<T>(float*, const T*, int, int, float*, cudaStream_t);  \
  template void gelu_forward<T>(T*, const T*, std::size_t, cudaStream_t);            \
  template void gelu_backward<T>(T*, const T*, const T*, std::size_t, cudaStream_t); \
  template void to_compute<T>(T*, const float*, std::size_t, cudaStream_t);          \
  template void to_float<T>(float*, const T*, std::size_t, cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
