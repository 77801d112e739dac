// The test kernels of the emulator's PTX instructions (launchers in ptx_test_kernels.hpp),
// rewritten by emulate_cu.cmake like the backend's kernels. Some carry a planted fault.
#include <cstdint>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/warp_mma.cuh"
#include "ptx_test_kernels.hpp"

namespace emulator_ptx_test {

namespace {

namespace ptx = pptrain::ops::cuda::ptx;
using bf16 = __nv_bfloat16;

__device__ std::uint32_t two(const bf16* p, std::size_t lo, std::size_t hi) {
  return ptx::pack_bf16(__bfloat162float(p[lo]), __bfloat162float(p[hi]));
}

__global__ void mma_from_layout_kernel(float* d, const bf16* a, const bf16* b, const float* c) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const std::uint32_t fa[4] = {two(a, g * 16 + 2 * t, g * 16 + 2 * t + 1),
                               two(a, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1),
                               two(a, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9),
                               two(a, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9)};
  const std::uint32_t fb[2] = {two(b, 2 * t * 8 + g, (2 * t + 1) * 8 + g),
                               two(b, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g)};
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                  c[(g + 8) * 8 + 2 * t + 1]};
  ptx::mma_bf16_16816(acc, fa, fb, acc);
  d[g * 8 + 2 * t] = acc[0], d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2], d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

__global__ void ldmatrix_product_kernel(float* d, const bf16* a, const bf16* b, int route) {
  constexpr int ld = 24;  // shared row stride in elements: 48 bytes, rows 16-byte aligned
  __shared__ __align__(16) bf16 sa[16 * ld];
  __shared__ __align__(16) bf16 sb[16 * ld];
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, col = e % 16;
    sa[r * ld + col] = a[e];
    sb[(route == 2 ? col * ld + r : r * ld + col)] = b[e];  // route 2: [n][k]
  }
  __syncwarp();
  std::uint32_t fa[4], fb[4];
  ptx::ldmatrix_x4(fa, sa + (lane % 16) * ld + lane / 16 * 8);
  if (route == 0) {  // [k][n]: lanes 0-15 rows k of columns 0-7, lanes 16-31 of 8-15
    ptx::ldmatrix_x4_trans(fb, sb + (lane % 16) * ld + lane / 16 * 8);
  } else if (route == 1) {
    std::uint32_t lo[2], hi[2];
    ptx::ldmatrix_x2_trans(lo, sb + (lane % 16) * ld);
    ptx::ldmatrix_x2_trans(hi, sb + (lane % 16) * ld + 8);
    fb[0] = lo[0], fb[1] = lo[1], fb[2] = hi[0], fb[3] = hi[1];
  } else {  // [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), ...
    ptx::ldmatrix_x4(fb, sb + (lane % 8 + lane / 16 * 8) * ld + lane / 8 % 2 * 8);
  }
  for (int n = 0; n < 2; ++n) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const std::uint32_t bn[2] = {fb[2 * n], fb[2 * n + 1]};
    ptx::mma_bf16_16816(acc, fa, bn, acc);
    const int col = 8 * n + 2 * t;
    d[g * 16 + col] = acc[0], d[g * 16 + col + 1] = acc[1];
    d[(g + 8) * 16 + col] = acc[2], d[(g + 8) * 16 + col + 1] = acc[3];
  }
}

__global__ void cp_async_groups_kernel(float* out, const float* src) {
  __shared__ __align__(16) float buf[32 * 8];
  const int i = threadIdx.x;
  float* o = out + 24 * i;
  ptx::cp_async_16(buf + 8 * i, src + 8 * i, true);
  ptx::cp_async_commit();
  ptx::cp_async_16(buf + 8 * i + 4, src + 8 * i + 4, false);
  ptx::cp_async_commit();
  for (int k = 0; k < 8; ++k) o[k] = buf[8 * i + k];
  ptx::cp_async_wait<1>();
  for (int k = 0; k < 8; ++k) o[8 + k] = buf[8 * i + k];
  ptx::cp_async_wait<0>();
  for (int k = 0; k < 8; ++k) o[16 + k] = buf[8 * i + k];
}

__global__ void cp_async_misaligned_kernel(const float* src) {
  __shared__ __align__(16) float buf[8];
  ptx::cp_async_16(buf, src + 1, true);
}

__global__ void cp_async_to_global_kernel(float* dst, const float* src) {
  ptx::cp_async_16(dst, src, true);
}

__global__ void ldmatrix_misaligned_kernel() {
  __shared__ __align__(16) bf16 rows[32 * 8 + 8];
  for (int e = threadIdx.x; e < 32 * 8 + 8; e += 32) rows[e] = __float2bfloat16_rn(0.0f);
  __syncwarp();
  std::uint32_t r[4];
  ptx::ldmatrix_x4(r, rows + 8 * threadIdx.x + (threadIdx.x == 5 ? 4 : 0));
}

__global__ void vector_load_misaligned_kernel(float* out, const float* src) {
  const auto v = pptrain::ops::cuda::load_pack<4>(src + 1);
  out[0] = v.v[0] + v.v[1] + v.v[2] + v.v[3];
}

}  // namespace

void mma_from_layout(float* d, const bf16* a, const bf16* b, const float* c) {
  mma_from_layout_kernel<<<1, 32>>>(d, a, b, c);
  (void)cudaDeviceSynchronize();
}
void ldmatrix_product(float* d, const bf16* a, const bf16* b, int route) {
  ldmatrix_product_kernel<<<1, 32>>>(d, a, b, route);
  (void)cudaDeviceSynchronize();
}
void cp_async_groups(float* out, const float* src) {
  cp_async_groups_kernel<<<1, 32>>>(out, src);
  (void)cudaDeviceSynchronize();
}
void cp_async_misaligned(const float* src) {
  cp_async_misaligned_kernel<<<1, 1>>>(src);
  (void)cudaDeviceSynchronize();
}
void cp_async_to_global(float* dst, const float* src) {
  cp_async_to_global_kernel<<<1, 1>>>(dst, src);
  (void)cudaDeviceSynchronize();
}
void ldmatrix_misaligned() {
  ldmatrix_misaligned_kernel<<<1, 32>>>();
  (void)cudaDeviceSynchronize();
}
void vector_load_misaligned(float* out, const float* src) {
  vector_load_misaligned_kernel<<<1, 1>>>(out, src);
  (void)cudaDeviceSynchronize();
}

}  // namespace emulator_ptx_test
