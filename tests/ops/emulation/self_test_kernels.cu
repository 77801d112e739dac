// The CUDA emulator's own test kernels (launchers in self_test_kernels.hpp), rewritten by
// emulate_cu.cmake like the backend's kernels. Several carry a planted bug on purpose.
// The launchers of the block-model checks synchronise before they return (their kernels
// write to the caller's arrays, some on the launcher's stack); the stream-test launchers
// only queue their kernel.
#include <mma.h>

#include "self_test_kernels.hpp"

namespace emulator_selftest {

namespace {

__global__ void neighbour_read_kernel(float* out, int offset, bool with_barrier) {
  __shared__ float values[256];
  const int n = blockDim.x, t = threadIdx.x;
  values[t] = static_cast<float>(t + 1);
  if (with_barrier) __syncthreads();
  out[blockIdx.x * n + t] = values[((t + offset) % n + n) % n];
}

__global__ void warp_exchange_kernel(float* out, bool with_syncwarp) {
  __shared__ float lanes[32];
  const int lane = threadIdx.x;
  lanes[lane] = static_cast<float>(lane);
  if (with_syncwarp) __syncwarp();
  out[lane] = lanes[lane ^ 1];
}

__global__ void reuse_shared_kernel(float* out, bool with_barrier) {
  __shared__ float values[64];
  const int t = threadIdx.x;
  values[t] = static_cast<float>(t);
  __syncthreads();
  const float before = values[63 - t];
  if (with_barrier) __syncthreads();
  values[t] = static_cast<float>(100 + t);
  __syncthreads();
  out[t] = before + values[63 - t];
}

__global__ void store_then_read_kernel(float* out, bool with_syncwarp) {
  __shared__ __align__(32) float tile[16 * 16];
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  nvcuda::wmma::fill_fragment(acc, 2.0f);
  nvcuda::wmma::store_matrix_sync(tile, acc, 16, nvcuda::wmma::mem_row_major);
  if (with_syncwarp) __syncwarp();
  out[threadIdx.x] = tile[threadIdx.x];
}

__global__ void shuffles_kernel(unsigned* out) {
  const unsigned linear = threadIdx.x + threadIdx.y * blockDim.x;
  const unsigned lane = linear % 32;
  unsigned* o = out + 7 * linear;
  o[0] = __shfl_xor_sync(0xFFFFFFFFu, lane, 1);
  o[1] = __shfl_down_sync(0xFFFFFFFFu, lane, 3);
  o[2] = __shfl_up_sync(0xFFFFFFFFu, lane, 2);
  o[3] = __shfl_sync(0xFFFFFFFFu, lane, 7);
  o[4] = __ballot_sync(0xFFFFFFFFu, lane % 3 == 0);
  o[5] = __any_sync(0xFFFFFFFFu, lane == 5);
  o[6] = __all_sync(0xFFFFFFFFu, lane < 32);
}

__global__ void grid_indices_kernel(int* out) {
  if (threadIdx.x == 0)
    out[blockIdx.y * gridDim.x + blockIdx.x] =
        blockIdx.x + 10 * blockIdx.y + 100 * gridDim.x + 1000 * gridDim.y;
}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    __syncthreads();
}

__global__ void exited_lanes_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1.0f, 1);
}

__global__ void deadlock_kernel() {
  if (threadIdx.x >= 16 && threadIdx.x < 32) __syncwarp();  // waits for lanes 0..15,
  __syncthreads();                                          // which wait here for it
}

__global__ void dynamic_overflow_kernel(int n) {
  extern __shared__ float dyn[];
  if (threadIdx.x == 0) dyn[n] = 1.0f;
}

__global__ void static_too_big_kernel(float* out) {
  __shared__ float big[13 * 1024];
  big[threadIdx.x] = 0.0f;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void poisoned_kernel(float* out) {
  __shared__ float s[4];
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) {
    s[0] = 1.0f;
    out[0] = s[1];
  } else {
    out[1] = s[0];
  }
}

__global__ void status_kernel(float* out) {
  extern __shared__ float dyn[];
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) out[0] = dyn != nullptr;
}

namespace wmma = nvcuda::wmma;
__global__ void wmma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b,
                            const float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, 24);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(acc, c, 20, wmma::mem_row_major);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 20, wmma::mem_row_major);
}

__global__ void fill_kernel(float* x, int n, float value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

__global__ void scale_add_kernel(float* x, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}

__global__ void sum_kernel(float* out, const float* x, int n) {
  if (threadIdx.x != 0) return;
  float total = 0.0f;
  for (int i = 0; i < n; ++i) total += x[i];
  *out = total;
}

__global__ void copy_kernel(float* dst, const float* src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

// The block-model checks' kernels write to their caller's memory: done before return.
void finish() { (void)cudaDeviceSynchronize(); }

}  // namespace

void neighbour_read(float* out, int blocks, int n, int offset, bool with_barrier) {
  neighbour_read_kernel<<<blocks, n>>>(out, offset, with_barrier);
  finish();
}
void warp_exchange(float* out, bool with_syncwarp) {
  warp_exchange_kernel<<<1, 32>>>(out, with_syncwarp);
  finish();
}
void reuse_shared(float* out, bool with_barrier) {
  reuse_shared_kernel<<<1, 64>>>(out, with_barrier);
  finish();
}
void wmma_store_then_read(float* out, bool with_syncwarp) {
  store_then_read_kernel<<<1, 32>>>(out, with_syncwarp);
  finish();
}
void shuffles(unsigned* out) {
  shuffles_kernel<<<1, dim3(16, 4)>>>(out);
  finish();
}
void grid_indices(int* out) {
  grid_indices_kernel<<<dim3(2, 3), 32>>>(out);
  finish();
}
void divergent_barrier() {
  divergent_barrier_kernel<<<1, 64>>>();
  finish();
}
void shuffle_with_exited_lanes() {
  float out[32];
  exited_lanes_kernel<<<1, 32>>>(out);
  finish();
}
void deadlock() {
  deadlock_kernel<<<1, 64>>>();
  finish();
}
void dynamic_shared_overflow() {
  dynamic_overflow_kernel<<<1, 32, 40 * sizeof(float)>>>(40);
  finish();
}
void static_shared_too_big() {
  float out[32];
  static_too_big_kernel<<<1, 32>>>(out);
  finish();
}
void shared_memory_poisoned(float* out) {
  poisoned_kernel<<<2, 32>>>(out);
  finish();
}

cudaError_t launch_status(int threads, int grid_y, int smem, int allow) {
  if (allow > 0) {
    const cudaError_t e =
        cudaFuncSetAttribute(status_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, allow);
    if (e != cudaSuccess) return e;
  }
  float out[1];
  status_kernel<<<dim3(1, grid_y), threads, smem>>>(out);
  const cudaError_t status = cudaGetLastError();
  finish();
  return status;
}

void wmma_product(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c,
                  int shift) {
  wmma_kernel<<<1, 32>>>(d, a + shift, b, c);
  finish();
}

void fill(float* x, int n, float value, cudaStream_t s) {
  fill_kernel<<<(n + 127) / 128, 128, 0, s>>>(x, n, value);
}
void scale_add(float* x, int n, float a, float b, cudaStream_t s) {
  scale_add_kernel<<<(n + 127) / 128, 128, 0, s>>>(x, n, a, b);
}
void sum(float* out, const float* x, int n, cudaStream_t s) { sum_kernel<<<1, 32, 0, s>>>(out, x, n); }
void copy(float* dst, const float* src, int n, cudaStream_t s) {
  copy_kernel<<<(n + 127) / 128, 128, 0, s>>>(dst, src, n);
}

}  // namespace emulator_selftest
