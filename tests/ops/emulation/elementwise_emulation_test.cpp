// The elementwise kernels (elementwise.cu) under the CUDA emulator against the CPU
// backend, for float and bf16 elements: add, the bias add and its gradient,
// GELU forward and backward, and the casts. Each op runs on 16-byte aligned arrays (the
// pack path where the size allows it) and on arrays one element off (the scalar path).
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
class EmulatedElementwise : public ::testing::Test {
 protected:
  ops::CpuOps cpu{1};
};
TYPED_TEST_SUITE(EmulatedElementwise, ElementTypes, ElementTypeNames);

constexpr std::size_t kSizes[] = {1, 37, 1000, 4099};

TYPED_TEST(EmulatedElementwise, AddMatchesCpu) {
  using T = TypeParam;
  for (std::size_t n : kSizes)
    for (std::size_t skew : {0, 1}) {
      const std::vector<float> a = rounded<T>(randn(n, 1)), b = rounded<T>(randn(n, 2));
      Device<T> da(a, skew), db(b, skew), out(n, skew);
      kern::add<T>(out.get(), da.get(), db.get(), n, nullptr);
      std::vector<float> want(n);
      this->cpu.add(want.data(), a.data(), b.data(), n);
      // One fp32 add rounded once: the same bits as the CPU's sum rounded to T.
      EXPECT_TRUE(all_close(out.read(), rounded<T>(want), 0.0)) << "n " << n << " skew " << skew;
    }
}

TYPED_TEST(EmulatedElementwise, AddBiasMatchesCpu) {
  using T = TypeParam;
  // (N, C): odd columns, columns that take the packs, more rows than the grid's 4096.
  const int shapes[][2] = {{5, 37}, {3, 64}, {7, 72}, {4099, 8}};
  for (const auto& [N, C] : shapes)
    for (std::size_t skew : {0, 1}) {
      std::vector<float> out = rounded<T>(randn(std::size_t(N) * C, 5));
      const std::vector<float> bias = rounded<T>(randn(C, 6));
      Device<T> dout(out, skew), dbias(bias, skew);
      kern::add_bias<T>(dout.get(), dbias.get(), N, C, nullptr);
      this->cpu.add_bias(out.data(), bias.data(), N, C);
      EXPECT_TRUE(all_close(dout.read(), rounded<T>(out), 0.0))
          << N << "x" << C << " skew " << skew;
    }
}

TYPED_TEST(EmulatedElementwise, BiasBackwardAccumulatesColumnSums) {
  using T = TypeParam;
  const int shapes[][2] = {{1, 37}, {70, 64}, {130, 37}};  // 1, 2 and 3 row chunks
  for (const auto& [N, C] : shapes) {
    const std::vector<float> dout = rounded<T>(randn(std::size_t(N) * C, 7));
    std::vector<float> dbias = randn(C, 8);
    Device<T> d(dout);
    Device<float> db(dbias), scratch(kern::bias_backward_scratch_floats(N, C));
    kern::bias_backward<T>(db.get(), d.get(), N, C, scratch.get(), nullptr);
    this->cpu.bias_backward(dbias.data(), dout.data(), N, C);
    EXPECT_TRUE(all_close(db.read(), dbias, 1e-5)) << N << "x" << C;
  }
}

TYPED_TEST(EmulatedElementwise, GeluForwardAndBackwardMatchCpu) {
  using T = TypeParam;
  for (std::size_t n : kSizes)
    for (std::size_t skew : {0, 1}) {
      const std::vector<float> x = rounded<T>(randn(n, 9, 2.0f)), g = rounded<T>(randn(n, 10));
      Device<T> dx(x, skew), dg(g, skew), y(n, skew), dinp(n, skew);
      kern::gelu_forward<T>(y.get(), dx.get(), n, nullptr);
      kern::gelu_backward<T>(dinp.get(), dx.get(), dg.get(), n, nullptr);
      std::vector<float> want_y(n), want_d(n);
      this->cpu.gelu_forward(want_y.data(), x.data(), n);
      this->cpu.gelu_backward(want_d.data(), x.data(), g.data(), n);
      EXPECT_TRUE(all_close(y.read(), rounded<T>(want_y), tol<T>(1e-6, 1e-2))) << "n " << n;
      EXPECT_TRUE(all_close(dinp.read(), rounded<T>(want_d), tol<T>(1e-6, 1e-2))) << "n " << n;
      // In place: the gradient over dout.
      kern::gelu_backward<T>(dg.get(), dx.get(), dg.get(), n, nullptr);
      EXPECT_TRUE(all_close(dg.read(), dinp.read(), 0.0)) << "in place, n " << n;
    }
}

TYPED_TEST(EmulatedElementwise, CastsRoundToNearestEvenAndWiden) {
  using T = TypeParam;
  for (std::size_t n : kSizes)
    for (std::size_t skew : {0, 1}) {
      std::vector<float> x = randn(n, 11, 100.0f);
      if (n >= 4) x[0] = 1.0f + 1.0f / 256, x[1] = 1.0f + 3.0f / 256, x[2] = -0.0f, x[3] = 3e-39f;
      Device<float> src(x, skew), back(n, skew);
      Device<T> dst(n, skew);
      kern::to_compute<T>(dst.get(), src.get(), n, nullptr);
      kern::to_float<T>(back.get(), dst.get(), n, nullptr);
      EXPECT_TRUE(all_close(dst.read(), rounded<T>(x), 0.0)) << "n " << n;
      EXPECT_TRUE(all_close(back.read(), rounded<T>(x), 0.0)) << "n " << n;
    }
}

TEST(EmulatedElementwiseFp32, EmptyArraysLaunchNothing) {
  kern::add<float>(nullptr, nullptr, nullptr, 0, nullptr);
  kern::add_bias<bf16>(nullptr, nullptr, 0, 5, nullptr);
  kern::bias_backward<float>(nullptr, nullptr, 5, 0, nullptr, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace pptrain::emulation_test
