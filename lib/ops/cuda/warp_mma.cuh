// The warp-level PTX instructions the tensor-core kernels use (sm_80 and later), one
// inline function each: the bf16 m16n8k16 product with fp32 accumulators, ldmatrix, and
// the 16-byte asynchronous copy to shared memory with its commit and wait groups. The
// fragment layouts are PTX's (the ISA's "matrix fragments for mma.m16n8k16"): with
// g = lane / 4 and t = lane % 4, a lane holds
//   A 16x16 (row):  a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..),
//                   a[3] = (g+8, 2t+8..), two bf16 a register, the lower column low;
//   B 16x8 (col):   b[0] = (2t..2t+1, g), b[1] = (2t+8..2t+9, g);
//   C, D 16x8 f32:  (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
// ldmatrix: lanes 8i..8i+7 give matrix i's eight 16-byte row addresses; register i then
// holds row g, columns 2t and 2t+1 of matrix i (.trans: rows 2t and 2t+1 of column g).
// Under the CUDA emulator (tests/ops/emulation) the same calls run its emulation of
// these instructions.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace pptrain::ops::cuda::ptx {

// d = a * b + c (d may be c).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                               const std::uint32_t (&b)[2], const float (&c)[4]) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::mma_bf16_m16n8k16(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

#ifndef PPTRAIN_CUDA_EMULATOR
__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// Four 8x8 bf16 matrices from shared memory; `row` is this lane's row address.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::ldmatrix(r, 4, false, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::ldmatrix(r, 4, true, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], const void* row) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::ldmatrix(r, 2, false, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::ldmatrix(r, 2, true, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
#endif
}

// 16 bytes from global src to shared dst (both 16-byte aligned), or 16 zero bytes when
// !fill; lands at the cp_async_wait that covers its group.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool fill) {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::cp_async_16(dst, src, fill);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(fill ? 16 : 0));
#endif
}
// Closes the group of this thread's copies since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N of this thread's newest committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef PPTRAIN_CUDA_EMULATOR
  pptrain_emu::ptx::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Two floats rounded to bf16 in one register (x in the lower half), as an A fragment
// holds them.
__device__ __forceinline__ std::uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  std::uint32_t r;
  memcpy(&r, &v, sizeof(r));
  return r;
}

}  // namespace pptrain::ops::cuda::ptx
