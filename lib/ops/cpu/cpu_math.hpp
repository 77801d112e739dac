// Small row kernels shared by the CPU ops, written so the compiler can vectorise
// them without -ffast-math: a call-free exp for non-positive arguments and row
// reductions over eight fixed lanes (sums kept in double). The lane layout fixes the
// summation order, so results are identical on every call.
#pragma once
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "core/wide_clones.hpp"

namespace pptrain::ops::cpu {

// Column reductions (bias and LayerNorm weight gradients, embedding backward): calls
// f(c0, c1) from each OpenMP thread on one contiguous range of columns (multiples of 16),
// which it sums over every row in order. A column's sum never depends on the range it
// falls in, so the split may follow the thread count; one range per thread makes one
// pass over the rows, where narrow blocks walked every row's page once per block.
template <typename F>
void in_column_ranges(int C, F f) {
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    auto edge = [&](int64_t k) {
      return int(std::min<int64_t>(C, (C * k / threads + 15) / 16 * 16));
    };
    const int c0 = edge(t), c1 = edge(t + 1);
    if (c0 < c1) f(c0, c1);
  }
}
// out[i] = gelu(inp[i]) (tanh form) for i in [begin, end) (cpu_norm.cpp, wide clones).
void gelu_forward_range(float* out, const float* inp, std::size_t begin, std::size_t end);
// dinp[i] = gelu'(inp[i]) * dout[i] for i in [begin, end) (cpu_norm.cpp, wide clones).
void gelu_backward_range(float* dinp, const float* inp, const float* dout, std::size_t begin,
                         std::size_t end);

// Elementwise loops shorter than this stay on one thread (starting threads costs more).
inline constexpr std::ptrdiff_t kParallelMin = 1 << 14;

// exp(x) for x <= 0 (NaN stays NaN; below -80 gives 0, under 2e-35 away from the
// true value). Relative error about 2e-7: exp(x) = 2^n * exp(r), |r| <= ln2/2, with
// a degree-7 Taylor polynomial for exp(r), summed in Estrin's order: the same terms as
// Horner's, with a dependency chain half as long (these loops are latency-bound).
inline float exp_nonpositive(float x) {
  const float xc = x < -80.0f ? -80.0f : x;
  // Adding 1.5 * 2^23 rounds x log2(e) to an integer n, held in the low mantissa bits.
  const float round_magic = 12582912.0f;
  const float shifted = xc * 1.44269504f + round_magic;
  const float n = shifted - round_magic;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(round_magic);
  // r = x - n * ln2, with ln2 split in two so the product n * ln2_hi is exact.
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r, r4 = r2 * r2;
  const float p01 = 1.0f + r, p23 = 0.5f + r * (1.0f / 6.0f);
  const float p45 = 1.0f / 24.0f + r * (1.0f / 120.0f);
  const float p67 = 1.0f / 720.0f + r * (1.0f / 5040.0f);
  const float p = (p01 + r2 * p23) + r4 * (p45 + r2 * p67);
  const uint32_t bits = std::bit_cast<uint32_t>(p) + (static_cast<uint32_t>(n_int) << 23);
  // Unconditional compares and selects, so the loop calling this vectorises.
  const bool is_nan = x != x;
  const bool underflow = x < -80.0f;
  const float y = underflow ? 0.0f : std::bit_cast<float>(bits);
  return is_nan ? x : y;
}

// -|x|, the sign bit set: one bitwise OR on any vector width.
inline float negative_magnitude(float x) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(x) | 0x80000000u);
}

// Largest of v[0..n) (n >= 1); NaNs are skipped here and surface later through exp.
inline float row_max(const float* v, int n) {
  float lane[8];
  for (int k = 0; k < 8; ++k) lane[k] = v[0];
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] = v[j + k] > lane[k] ? v[j + k] : lane[k];
  for (; j < n; ++j) lane[0] = v[j] > lane[0] ? v[j] : lane[0];
  float m = lane[0];
  for (int k = 1; k < 8; ++k) m = lane[k] > m ? lane[k] : m;
  return m;
}

// sum_j a[j] * b[j] over eight double lanes.
inline double row_dot(const float* a, const float* b, int n) {
  double lane[8] = {};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] += static_cast<double>(a[j + k]) * b[j + k];
  double s = 0.0;
  for (; j < n; ++j) s += static_cast<double>(a[j]) * b[j];
  for (int k = 0; k < 8; ++k) s += lane[k];
  return s;
}

// sum_j v[j] over eight double lanes.
inline double row_sum(const float* v, int n) {
  double lane[8] = {};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] += v[j + k];
  double s = 0.0;
  for (; j < n; ++j) s += v[j];
  for (int k = 0; k < 8; ++k) s += lane[k];
  return s;
}

}  // namespace pptrain::ops::cpu
