// A CPU emulator of the CUDA execution model, so the kernel sources (lib/ops/cuda/*.cu)
// compile as host C++20 and run in tests without a GPU. The fake toolkit headers in
// include/ (cuda_runtime.h, cuda_bf16.h, mma.h, cublasLt.h) lead here; emulate_cu.cmake
// rewrites what is not C++ (launches, __shared__ declarations) in build-dir copies.
//
// The model (emulator_block.cpp): a launch is queued on its stream and runs when the
// stream's work is due (emulator_streams.hpp), its blocks one after another. A block's
// threads are fibers on the calling thread, scheduled cooperatively and deterministically:
// a thread runs until it waits at a barrier (__syncthreads, or a warp collective:
// __syncwarp, shuffles, votes, wmma operations) or exits, then the first runnable thread in
// the block's order runs; the order is ascending thread index in even blocks and
// descending in odd ones (ScheduleOrder). So a warp runs as far ahead of the others as the
// barriers let it, in one direction and then the other: a read that lacks a barrier after
// another thread's write sees poison (shared memory is filled with 0xFF bytes, NaN, before
// each block) or a stale value, and a write that lacks a barrier after another thread's
// read changes what that thread reads (wmma: see emulator_wmma.hpp). Checked too: launch
// configurations and shared-memory limits, __syncthreads reached from different places,
// warp collectives whose lanes disagree or have exited, deadlocks, writes past the shared
// memory.
//
// Limits: no memory model, timing or caches; warps have no lockstep (as under Volta's
// independent scheduling), and a missing __syncwarp shows only where the order exposes it
// (never between two warp collectives, which wait for every lane anyway); races between
// blocks through global memory are invisible (blocks run one after another); code that
// spins on a flag another thread sets hangs.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstring>
#include <source_location>

// ---- CUDA keywords ----
#define __global__ __attribute__((unused))  // kernels are used by launches
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Every __shared__ declaration is rewritten by emulate_cu.cmake; one it cannot parse
// stops the build here.
#define __shared__ PPTRAIN_EMULATOR_CANNOT_REWRITE_THIS_SHARED_DECLARATION

#include "emulator_counters.hpp"
#include "emulator_ptx.hpp"
#include "emulator_runtime.hpp"

// Kernel headers that wrap PTX (warp_mma.cuh) call emulator_ptx.hpp under this.
#define PPTRAIN_CUDA_EMULATOR 1

// ---- the names kernels use ----
using dim3 = pptrain_emu::Dim3;
using uint3 = pptrain_emu::UInt3;
using float2 = pptrain_emu::Float2;
using float4 = pptrain_emu::Float4;
using uint4 = pptrain_emu::UInt4;
using int4 = pptrain_emu::Int4;
using cudaStream_t = pptrain_emu::Stream*;
using __nv_bfloat16 = pptrain_emu::BFloat16;
using __nv_bfloat162 = pptrain_emu::BFloat162;
using pptrain_emu::cudaError_t;
using pptrain_emu::cudaErrorInvalidConfiguration;
using pptrain_emu::cudaErrorInvalidValue;
using pptrain_emu::cudaFuncAttribute;
using pptrain_emu::cudaFuncAttributeMaxDynamicSharedMemorySize;
using pptrain_emu::cudaSuccess;
inline constexpr int warpSize = 32;

// Set by the scheduler before it resumes a thread.
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

// ---- runtime API (the host side is in emulator_host_api.hpp) ----
static inline cudaError_t cudaGetLastError() { return pptrain_emu::take_last_error(); }
static inline cudaError_t cudaPeekAtLastError() { return pptrain_emu::peek_last_error(); }
template <typename K>
cudaError_t cudaFuncSetAttribute(K* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
    return cudaErrorInvalidValue;
  pptrain_emu::set_max_dynamic_shared(reinterpret_cast<std::uintptr_t>(kernel), value);
  return cudaSuccess;
}
#include "emulator_host_api.hpp"

// ---- synchronisation and warp intrinsics ----
inline void __syncthreads(std::source_location w = std::source_location::current()) {
  pptrain_emu::sync_block(w);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu,
                       std::source_location w = std::source_location::current()) {
  pptrain_emu::sync_warp("__syncwarp", mask, nullptr, nullptr, nullptr, w);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32,
              std::source_location w = std::source_location::current()) {
  const int lane = pptrain_emu::lane_id();
  return pptrain_emu::shuffle("__shfl_sync", mask, v, lane / width * width + src % width, w);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  std::source_location w = std::source_location::current()) {
  const int lane = pptrain_emu::lane_id();
  return pptrain_emu::shuffle("__shfl_xor_sync", mask, v,
                              pptrain_emu::segment_lane(lane, lane ^ lane_mask, width), w);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   std::source_location w = std::source_location::current()) {
  const int lane = pptrain_emu::lane_id();
  return pptrain_emu::shuffle("__shfl_down_sync", mask, v,
                              pptrain_emu::segment_lane(lane, lane + int(delta), width), w);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 std::source_location w = std::source_location::current()) {
  const int lane = pptrain_emu::lane_id();
  return pptrain_emu::shuffle("__shfl_up_sync", mask, v,
                              pptrain_emu::segment_lane(lane, lane - int(delta), width), w);
}
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location w = std::source_location::current()) {
  pptrain_emu::VoteData d{predicate != 0, 0};
  pptrain_emu::sync_warp("vote", mask, &d, &pptrain_emu::complete_ballot, nullptr, w);
  return d.result;
}
inline int __any_sync(unsigned mask, int predicate,
                      std::source_location w = std::source_location::current()) {
  return (__ballot_sync(mask, predicate, w) & mask) != 0;
}
inline int __all_sync(unsigned mask, int predicate,
                      std::source_location w = std::source_location::current()) {
  return (__ballot_sync(mask, predicate, w) & mask) == mask;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// Atomics need no atomicity: only one emulated thread runs at a time.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}

// ---- math: host functions with the same rounding where CUDA promises it ----
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
// The _rn operations round once each; emulate_cu.cmake builds with -ffp-contract=off.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
using std::isfinite;
using std::sqrt;

// ---- bf16 conversions ----
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {a, b}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return {f.x, f.y}; }
inline float2 __bfloat1622float2(__nv_bfloat162 b) { return {float(b.x), float(b.y)}; }
inline float __low2float(__nv_bfloat162 b) { return float(b.x); }
inline float __high2float(__nv_bfloat162 b) { return float(b.y); }
