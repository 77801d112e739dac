// Launchers of the checks of the emulator's PTX instructions (ptx_test_kernels.cu, over
// lib/ops/cuda/warp_mma.cuh); each runs one warp or block and synchronises the device
// before it returns.
#pragma once
#include <cuda_bf16.h>

namespace emulator_ptx_test {

// d = a b + c for a [16][16] (row-major), b [16][8] (row-major, [k][n]) and c, d
// [16][8] fp32, one mma.sync whose fragments each lane builds from PTX's layout.
void mma_from_layout(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c);
// d [16][16] = a [16][16] b [16][16] (row-major; b is [k][n]) as two mma.sync (one a
// column block of 8) with operands from ldmatrix in shared memory: a by .x4; b by .x4.trans
// (route 0), two .x2.trans (route 1), or .x4 from a transposed copy, [n][k] (route 2).
void ldmatrix_product(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, int route);

// 32 threads; thread i copies src[8i .. 8i+4) (group 1) and src[8i+4 .. 8i+8) (group 2,
// with fill = false: zeros) to shared memory with cp.async, and writes what it reads of
// its two destinations to out[24i ..): 8 floats before any wait, 8 after wait_group 1,
// 8 after wait_group 0.
void cp_async_groups(float* out, const float* src);
// Planted faults, each must throw: a cp.async from an address that is not 16-byte
// aligned; a cp.async into global memory; an ldmatrix row that is not 16-byte aligned; a
// 16-byte load from device memory that is not 16-byte aligned (src + 1).
void cp_async_misaligned(const float* src);
void cp_async_to_global(float* dst, const float* src);
void ldmatrix_misaligned();
void vector_load_misaligned(float* out, const float* src);

}  // namespace emulator_ptx_test
