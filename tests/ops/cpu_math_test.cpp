// The CPU backend's row kernels (exp, tanh, max, sum, dot) against libm and plain loops,
// and NaN propagation through the ops that use them.
#include "ops/cpu/cpu_math.hpp"

#include <gtest/gtest.h>

#include <cmath>
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

// GELU adds tanh to 1, so what matters is the absolute error; tanh is odd and exact
// at 0 and in the saturated tails.
TEST(CpuMath, TanhMatchesLibmToAnAbsoluteFewE7) {
  double worst = 0.0;
  for (int i = -200000; i <= 200000; ++i) {
    const float x = 12.0f * static_cast<float>(i) / 200000.0f;
    worst = std::max(worst, std::fabs(cpu::tanh_float(x) - std::tanh(static_cast<double>(x))));
    EXPECT_EQ(cpu::tanh_float(-x), -cpu::tanh_float(x));
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(cpu::tanh_float(0.0f), 0.0f);
  EXPECT_EQ(cpu::tanh_float(50.0f), 1.0f);
  EXPECT_TRUE(std::isnan(cpu::tanh_float(std::numeric_limits<float>::quiet_NaN())));
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
