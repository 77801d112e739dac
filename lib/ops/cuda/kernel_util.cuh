// Device helpers shared by the kernel files: fp32 load/store of float and bf16
// elements, 16-byte packs, warp and block reductions in a fixed order, the
// grid-stride loop over packs, the two-pass column sum, and the launchers'
// precondition and launch checks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.hpp"  // PPTRAIN_CHECK: the launchers' preconditions
#include "ops/cuda/cuda_check.hpp"
#include "ops/ops.hpp"  // what the kernels ask for, as the memory plan counts it

namespace pptrain::ops::cuda {

// ---- element conversion: all arithmetic is fp32; bf16 stores round to nearest even ----
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// ---- packs: W consecutive elements moved as one aligned load/store ----
template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};
// (A misaligned pack faults on a GPU; the CUDA emulator checks it.)
template <int W, typename T>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::check_vector_access(p, sizeof(Pack<T, W>));
#endif
  return *reinterpret_cast<const Pack<T, W>*>(p);
}
template <int W, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, W>& x) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::check_vector_access(p, sizeof(Pack<T, W>));
#endif
  *reinterpret_cast<Pack<T, W>*>(p) = x;
}
// Elements of T in one 16-byte pack: 4 floats or 8 bf16.
template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// A compile-time pack width handed to the loop bodies below.
template <int W>
struct Width {
  static constexpr int value = W;
};

// True when every pointer is 16-byte aligned (null pointers pass).
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Grid-stride loop over [0, n): f(i, Width<W>{}) for the full packs starting at i,
// then f(i, Width<1>{}) for each element of the tail.
template <int W, typename F>
__device__ __forceinline__ void for_each_pack(std::size_t n, F f) {
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t full = n / W * W;
  for (std::size_t i = tid * W; i < full; i += stride * W) f(i, Width<W>{});
  for (std::size_t i = full + tid; i < n; i += stride) f(i, Width<1>{});
}

// Blocks for a grid-stride loop over `work` items with `threads` per block. The cap
// keeps the grid a few waves deep on any current GPU.
inline unsigned grid_for(std::size_t work, int threads) {
  constexpr std::size_t kMaxBlocks = 8192;
  const std::size_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// ---- reductions; the shuffle pattern is fixed, so results are the same every run ----
template <typename V>
__device__ __forceinline__ V warp_sum(V x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every
// thread. `shared` holds 32 values; the call begins and ends with a barrier, so it
// can be reused right away.
template <typename V>
__device__ V block_sum(V x, V* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : V(0);
  x = warp_sum(x);
  __syncthreads();
  return x;
}
__device__ inline float block_max(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : -INFINITY;
  x = warp_max(x);
  __syncthreads();
  return x;
}

// ---- deterministic column sums of [N, C] arrays, in two passes ----
// Pass 1 (a kernel of the op) sums each chunk of kColumnSumRows consecutive rows per
// column into scratch[chunk * C + c]; column_sum_finish then adds the chunks in
// order to out[c]. The chunking depends only on N, so the order is fixed.
inline constexpr int kColumnSumRows = kCudaColumnSumRows;  // ops.hpp: the plan counts it
inline int column_sum_chunks(int N) { return (N + kColumnSumRows - 1) / kColumnSumRows; }

// out[c] += sum over chunks k of part[k * C + c], in order.
__device__ __forceinline__ void add_chunk_sums(float* __restrict__ out,
                                               const float* __restrict__ part, int chunks, int C,
                                               int c) {
  float acc = 0.0f;
  for (int k = 0; k < chunks; ++k) acc += part[static_cast<std::size_t>(k) * C + c];
  out[c] += acc;
}

// The column sums' second pass: a thread per column.
static __global__ void column_sum_finish(float* __restrict__ out, const float* __restrict__ part,
                                         int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) add_chunk_sums(out, part, chunks, C, c);
}

// Two such sums in one launch: blockIdx.y 0 finishes (out0, part0), 1 (out1, part1).
static __global__ void column_sum_finish_pair(float* out0, const float* part0, float* out1,
                                              const float* part1, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  if (blockIdx.y == 0)
    add_chunk_sums(out0, part0, chunks, C, c);
  else
    add_chunk_sums(out1, part1, chunks, C, c);
}

// Lets `kernel` use `bytes` of dynamic shared memory (above the 48 KiB default) on the
// current device: set once per kernel and device (a kernel always asks for the same
// bytes), not on every launch.
template <typename K>
void allow_smem(K* kernel, std::size_t bytes) {
  static std::mutex mutex;  // guards `done`, the (kernel, device) pairs set so far
  static std::set<std::pair<const void*, int>> done;
  int device = 0;
  PPTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(key)) return;
  PPTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
  done.insert(key);
}

}  // namespace pptrain::ops::cuda
