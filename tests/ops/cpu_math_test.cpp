// The CPU backend's row kernels (exp, tanh, max, sum, dot) against libm and plain loops,
// and NaN propagation through the ops that use them.
#include "ops/cpu/cpu_math.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops {
namespace {

TEST(CpuMath, ExpMatchesLibmOnNonPositiveArguments) {
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -80.0f * static_cast<float>(i) / 200000.0f;
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(cpu::exp_nonpositive(x) - ref) / ref);
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_EQ(cpu::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp_nonpositive(-100.0f), 0.0f);
  EXPECT_EQ(cpu::exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}

// GELU (tanh form) and its derivative against double, at float inputs. gelu = x s
// with s = sigmoid(2u) in [0, 1]: what bounds the error is s's absolute error (scaled
// by |x|), plus the rounding of 2u itself, which exp magnifies by |2u| in the left tail.
TEST(CpuMath, GeluAndItsDerivativeMatchTheTanhFormulaInDouble) {
  const int n = 400001;
  std::vector<float> x(n), out(n), grad(n), ones(n, 1.0f);
  for (int i = 0; i < n; ++i) x[i] = 12.0f * static_cast<float>(i - n / 2) / (n / 2);
  cpu::gelu_forward_range(out.data(), x.data(), 0, n);
  cpu::gelu_backward_range(grad.data(), x.data(), ones.data(), 0, n);
  double worst_out = 0.0, worst_grad = 0.0;
  for (int i = 0; i < n; ++i) {
    const double v = x[i], k = std::sqrt(2.0 / M_PI), u = k * (v + 0.044715 * v * v * v);
    const double th = std::tanh(u), du = k * (1.0 + 3.0 * 0.044715 * v * v);
    const double ref = 0.5 * v * (1.0 + th);
    const double dref = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * du;
    // allowed: 4e-7 of |x| (s's error) plus 1e-7 |2u| of the result (the argument's)
    const double tol_out = 4e-7 * std::fabs(v) + 1e-7 * std::fabs(2 * u * ref) + 1e-30;
    const double tol_grad = 4e-7 * (1.0 + std::fabs(v * du)) + 1e-7 * std::fabs(2 * u * dref);
    worst_out = std::max(worst_out, std::fabs(out[i] - ref) / tol_out);
    worst_grad = std::max(worst_grad, std::fabs(grad[i] - dref) / tol_grad);
  }
  EXPECT_LT(worst_out, 1.0);
  EXPECT_LT(worst_grad, 1.0);
  RecordProperty("worst_out_share_of_bound", std::to_string(worst_out));
  RecordProperty("worst_grad_share_of_bound", std::to_string(worst_grad));
  std::printf("worst share of the bound: gelu %.3f, derivative %.3f\n", worst_out, worst_grad);
  const float special[] = {0.0f, 50.0f, -50.0f, std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  float o[5], g[5], d[5] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  cpu::gelu_forward_range(o, special, 0, 5);
  cpu::gelu_backward_range(g, special, d, 0, 5);
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(g[0], 0.5f);
  EXPECT_EQ(o[1], 50.0f);
  EXPECT_EQ(g[1], 1.0f);
  EXPECT_EQ(o[2], 0.0f);
  EXPECT_EQ(g[2], 0.0f);
  EXPECT_EQ(o[3], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(o[4]) && std::isnan(g[4]));
}

TEST(CpuMath, RowReductionsMatchPlainLoops) {
  for (int n = 1; n <= 37; ++n) {
    const std::vector<float> a = testing::randn(n, 100 + n), b = testing::randn(n, 200 + n);
    float m = a[0];
    double s = 0, d = 0;
    for (int j = 0; j < n; ++j) {
      m = std::max(m, a[j]);
      s += a[j];
      d += double(a[j]) * b[j];
    }
    EXPECT_EQ(cpu::row_max(a.data(), n), m) << n;
    EXPECT_NEAR(cpu::row_sum(a.data(), n), s, 1e-12) << n;
    EXPECT_NEAR(cpu::row_dot(a.data(), b.data(), n), d, 1e-12) << n;
  }
}

TEST(CpuMath, NaNLogitsGiveNaNLoss) {
  auto ops = std::make_unique<CpuOps>(1);
  std::vector<float> logits = {0.5f, std::numeric_limits<float>::quiet_NaN(), 1.0f, 0.0f};
  const int32_t target = 0;
  float loss = 0.0f;
  ops->cross_entropy(&loss, nullptr, logits.data(), &target, 1, 4, 4, 1.0f);
  EXPECT_TRUE(std::isnan(loss));
}

TEST(CpuMath, NaNScoresGiveNaNAttention) {
  auto ops = std::make_unique<CpuOps>(1);
  const int T = 3, C = 4;
  std::vector<float> qkv = testing::randn(T * 3 * C, 300), out(T * C), att(T * T);
  qkv[2 * 3 * C + C] = std::numeric_limits<float>::quiet_NaN();  // k of token 2
  ops->attention_forward(out.data(), att.data(), qkv.data(), 1, T, C, 1, 1);
  EXPECT_FALSE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[2 * C]));
}

}  // namespace
}  // namespace pptrain::ops
