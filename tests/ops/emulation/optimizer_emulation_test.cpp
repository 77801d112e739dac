// The optimizer kernels (optimizer.cu) under the CUDA emulator against the CPU backend:
// AdamW with and without the float / bf16 weight copy, and the fp64 sum of squares.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "emulated_kernels.hpp"
#include "emulation_test_util.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::emulation_test {
namespace {

template <typename T>
class EmulatedOptimizer : public ::testing::Test {
 protected:
  ops::CpuOps cpu{1};
};
TYPED_TEST_SUITE(EmulatedOptimizer, ElementTypes, ElementTypeNames);

TYPED_TEST(EmulatedOptimizer, AdamWMatchesCpu) {
  using T = TypeParam;
  const ops::AdamWStep h{1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.1f, 1.0f / (1 - 0.9f * 0.9f),
                         1.0f / (1 - 0.95f * 0.95f), 0.5f};
  for (std::size_t n : {1, 37, 1001, 4096})
    for (std::size_t skew : {0, 1})
      for (bool with_weights : {true, false}) {
        std::vector<float> p = randn(n, 1), m = randn(n, 3, 0.1f), v = randn(n, 4);
        const std::vector<float> g = randn(n, 2);
        for (float& x : v) x = x * x * 0.01f;
        Device<float> dp(p, skew), dg(g, skew), dm(m, skew), dv(v, skew);
        Device<T> dw(n, skew);
        kern::adamw<T>(dp.get(), with_weights ? dw.get() : nullptr, dg.get(), dm.get(), dv.get(), n,
                       h.lr, h.beta1, h.beta2, h.one_minus_beta1, h.one_minus_beta2, h.eps,
                       h.weight_decay, h.inv_bias_correction1, h.inv_bias_correction2,
                       h.grad_scale, nullptr, nullptr);
        this->cpu.adamw(p.data(), nullptr, g.data(), m.data(), v.data(), n, h);
        // The _rn intrinsics follow the CPU's operations one rounding at a time, and each
        // is IEEE's correctly rounded operation: the same bits.
        EXPECT_TRUE(all_close(dp.read(), p, 0.0)) << "params, n " << n;
        EXPECT_TRUE(all_close(dm.read(), m, 0.0)) << "m, n " << n;
        EXPECT_TRUE(all_close(dv.read(), v, 0.0)) << "v, n " << n;
        if (with_weights) {
          EXPECT_TRUE(all_close(dw.read(), rounded<T>(p), 0.0)) << "weights";
        } else {
          for (float x : dw.read()) ASSERT_TRUE(std::isnan(x)) << "weights written though null";
        }
      }
}

TEST(EmulatedOptimizerFp64, SumSquaresMatchesCpu) {
  ops::CpuOps cpu(1);
  // An empty array (a memset); up to one 256-thread block; several blocks; more partial
  // sums than the final block's threads; more elements than the 1024 blocks' threads.
  for (std::size_t n : {0, 1, 255, 1001, 70000, 1024 * 256 + 1001}) {
    const std::vector<float> x = randn(n, 5, 3.0f);
    Device<float> dx(x);
    Device<double> out(1), scratch(kern::sum_squares_scratch_doubles());
    kern::sum_squares(out.get(), dx.get(), n, scratch.get(), nullptr);
    const double want = cpu.sum_squares({{x.data(), n}});
    EXPECT_NEAR(out.raw()[0], want, 1e-12 * want) << "n " << n;
  }
}

}  // namespace
}  // namespace pptrain::emulation_test
