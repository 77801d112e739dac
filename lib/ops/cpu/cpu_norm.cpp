// CPU backend: LayerNorm (eps 1e-5, biased variance as PyTorch) and GELU (tanh form).
// Row reductions run in double in a fixed order; rows (and GELU's elements) are split
// over the OpenMP threads, column sums by column ranges (each column summed by one
// thread), so results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include <omp.h>

#include "ops/cpu/cpu_math.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

namespace {
constexpr double kLayerNormEps = 1e-5;
// GELU's tanh form, 0.5 x (1 + tanh u) with u = sqrt(2 / pi) (x + 0.044715 x^3), is
// x sigmoid(2u). With e = exp(-|2u|), sigmoid(2u) is 1 / (1 + e) where u >= 0 and
// e / (1 + e) where u < 0, and sigmoid' = e / (1 + e)^2 either way: exp's argument is
// never positive, and no 1 - tanh cancels.
constexpr float kGeluTwoScale = 2.0f * 0.7978845608028654f;  // 2u = x (a + b x^2)
constexpr float kGeluTwoScaleCubic = kGeluTwoScale * 0.044715f;
}  // namespace

namespace {
// Columns [c0, c1) of the LayerNorm weight and bias gradients, summed over every row in
// order into acc_w and acc_b (wide clones).
PPTRAIN_WIDE_CLONES
void layernorm_weight_block(double* acc_w, double* acc_b, const float* dout, const float* inp,
                            const float* mean, const float* rstd, int N, int C, int c0, int c1) {
  for (int c = c0; c < c1; ++c) acc_w[c] = acc_b[c] = 0.0;
  for (int n = 0; n < N; ++n) {
    const std::size_t off = static_cast<std::size_t>(n) * C;
    const float* x = inp + off;
    const float* d = dout + off;
    const float m = mean[n];
    const float rs = rstd[n];
    for (int c = c0; c < c1; ++c) {
      acc_w[c] += d[c] * ((x[c] - m) * rs);
      acc_b[c] += d[c];
    }
  }
}
}  // namespace

namespace {
constexpr int kLanes = 8;  // double partial sums per row reduction, in a fixed pattern

// One row of the forward: mean and variance in double over eight lanes.
PPTRAIN_WIDE_CLONES
void layernorm_row(float* o, float* mean, float* rstd, const float* x, const float* w,
                   const float* b, int C) {
  double lane[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += x[c + k];
  double sum = 0.0;
  for (; c < C; ++c) sum += x[c];
  for (double l : lane) sum += l;
  const double m = sum / C;
  double sq_lane[kLanes] = {};
  for (c = 0; c + kLanes <= C; c += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const double d = x[c + k] - m;
      sq_lane[k] += d * d;
    }
  double sq = 0.0;
  for (; c < C; ++c) sq += (x[c] - m) * (x[c] - m);
  for (double l : sq_lane) sq += l;
  const float mf = static_cast<float>(m);
  const float rs = static_cast<float>(1.0 / std::sqrt(sq / C + kLayerNormEps));
  for (c = 0; c < C; ++c) o[c] = (x[c] - mf) * rs * w[c] + b[c];
  *mean = mf;
  *rstd = rs;
}

// One row of the input gradient: dx = dres + rstd * (g - mean(g) - xhat * mean(g * xhat)),
// g = dout * w, the two means in double over eight lanes.
PPTRAIN_WIDE_CLONES
void layernorm_row_backward(float* dx, const float* dres, const float* d, const float* x,
                            const float* w, float m, float rs, int C) {
  double lane_g[kLanes] = {}, lane_gx[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float g = d[c + k] * w[c + k];
      lane_g[k] += g;
      lane_gx[k] += static_cast<double>(g) * ((x[c + k] - m) * rs);
    }
  double sum_g = 0.0, sum_gx = 0.0;
  for (; c < C; ++c) {
    const float g = d[c] * w[c];
    sum_g += g;
    sum_gx += static_cast<double>(g) * ((x[c] - m) * rs);
  }
  for (int k = 0; k < kLanes; ++k) {
    sum_g += lane_g[k];
    sum_gx += lane_gx[k];
  }
  const float mean_g = static_cast<float>(sum_g / C);
  const float mean_gx = static_cast<float>(sum_gx / C);
  for (c = 0; c < C; ++c) {
    const float xhat = (x[c] - m) * rs;
    dx[c] = dres[c] + rs * (d[c] * w[c] - mean_g - xhat * mean_gx);
  }
}
}  // namespace

void CpuOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                               const float* w, const float* b, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t off = static_cast<std::size_t>(n) * C;
    layernorm_row(out + off, mean + n, rstd + n, inp + off, w, b, C);
  }
}

void CpuOps::layernorm_backward_input(float* dinp, const float* dresidual, const float* dout,
                                      const float* inp, const float* w, const float* mean,
                                      const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t off = static_cast<std::size_t>(n) * C;
    layernorm_row_backward(dinp + off, dresidual + off, dout + off, inp + off, w, mean[n],
                           rstd[n], C);
  }
}

void CpuOps::layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                                       const float* mean, const float* rstd, int N, int C) {
  double* acc_w = double_scratch(2 * static_cast<std::size_t>(C));
  double* acc_b = acc_w + C;
  cpu::in_column_ranges(C, [&](int c0, int c1) {
    layernorm_weight_block(acc_w, acc_b, dout, inp, mean, rstd, N, C, c0, c1);
    for (int c = c0; c < c1; ++c) {
      dw[c] += static_cast<float>(acc_w[c]);
      db[c] += static_cast<float>(acc_b[c]);
    }
  });
}

PPTRAIN_WIDE_CLONES
void cpu::gelu_forward_range(float* out, const float* inp, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    const float x = inp[i];
    const float two_u = x * (kGeluTwoScale + kGeluTwoScaleCubic * (x * x));
    const float e = cpu::exp_nonpositive(cpu::negative_magnitude(two_u));
    out[i] = x * ((two_u < 0.0f ? e : 1.0f) / (1.0f + e));
  }
}

PPTRAIN_WIDE_CLONES
void cpu::gelu_backward_range(float* dinp, const float* inp, const float* dout, std::size_t begin,
                              std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    const float x = inp[i];
    const float x2 = x * x;
    const float two_u = x * (kGeluTwoScale + kGeluTwoScaleCubic * x2);
    const float two_du = kGeluTwoScale + 3.0f * kGeluTwoScaleCubic * x2;  // d(2u)/dx
    const float e = cpu::exp_nonpositive(cpu::negative_magnitude(two_u));
    const float q = 1.0f / (1.0f + e);
    const float s = (two_u < 0.0f ? e : 1.0f) * q;  // sigmoid(2u)
    const float grad = s + x * two_du * (e * q * q);
    dinp[i] = grad * dout[i];
  }
}

namespace {

// Calls f(begin, end) on blocks of [0, n), one block per OpenMP thread when n is large.
template <typename F>
void in_thread_blocks(std::size_t n, F f) {
  if (static_cast<std::ptrdiff_t>(n) <= cpu::kParallelMin) return f(std::size_t(0), n);
#pragma omp parallel
  {
    const std::size_t threads = std::size_t(omp_get_num_threads()), t = std::size_t(omp_get_thread_num());
    f(n * t / threads, n * (t + 1) / threads);
  }
}
}  // namespace

void CpuOps::gelu_forward(float* out, const float* inp, std::size_t n) {
  in_thread_blocks(n, [&](std::size_t b, std::size_t e) {
    cpu::gelu_forward_range(out, inp, b, e);
  });
}

void CpuOps::gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) {
  in_thread_blocks(n, [&](std::size_t b, std::size_t e) {
    cpu::gelu_backward_range(dinp, inp, dout, b, e);
  });
}

}  // namespace pptrain::ops
