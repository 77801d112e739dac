// The optimizer kernels (optimizer.cu) under the CUDA emulator against the CPU backend:
// the multi-tensor AdamW with and without the float / bf16 weight copy, and the fp64
// sum of squares over many arrays.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <memory>
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

// The multi-tensor update against the CPU's update of each tensor alone: tensors of one
// element, of a tail, of several blocks; 16-byte aligned, and (skew, or a tensor that
// starts at an odd index) not; each with its weight decay; with and without the weight
// copy. Sixty tensors take two launches (the emulator counts them). The _rn intrinsics follow the CPU's operations
// one rounding at a time, and each is IEEE's correctly rounded operation: the same bits.
TYPED_TEST(EmulatedOptimizer, AdamWMatchesCpu) {
  using T = TypeParam;
  ops::AdamWStep h{1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.0f, 1.0f / (1 - 0.9f * 0.9f),
                   1.0f / (1 - 0.95f * 0.95f), 0.5f};
  std::vector<kern::AdamWTensor> tensors;
  std::size_t arena = 0, state = 3;  // the moments packed apart from the arena
  for (int i = 0; i < 60; ++i) {
    const std::size_t n = i % 4 == 0 ? 1 : i % 4 == 1 ? 37 : i % 4 == 2 ? 1001 : 9000 + i;
    tensors.push_back({arena, arena, state, n, i % 3 == 0 ? 0.0f : 0.1f});
    arena += n + (i % 5 == 0 ? 3 : 8 - n % 8), state += n;  // gaps; some starts misaligned
  }
  for (std::size_t skew : {0, 1})
    for (bool with_weights : {true, false}) {
      std::vector<float> p = randn(arena, 1), m = randn(state, 3, 0.1f), v = randn(state, 4);
      const std::vector<float> g = randn(arena, 2);
      for (float& x : v) x = x * x * 0.01f;
      Device<float> dp(p, skew), dg(g, skew), dm(m, skew), dv(v, skew);
      Device<T> dw(arena, skew);
      const unsigned long long launches = pptrain_emu::launch_count();
      kern::adamw<T>(dp.get(), with_weights ? dw.get() : nullptr, dg.get(), dm.get(), dv.get(),
                     tensors, h.lr, h.beta1, h.beta2, h.one_minus_beta1, h.one_minus_beta2, h.eps,
                     h.inv_bias_correction1, h.inv_bias_correction2, h.grad_scale, nullptr,
                     nullptr, nullptr);
      EXPECT_EQ(pptrain_emu::launch_count() - launches, 2u) << "a launch per 32 tensors";
      for (const kern::AdamWTensor& t : tensors) {
        h.weight_decay = t.weight_decay;
        this->cpu.adamw(p.data() + t.param, nullptr, g.data() + t.arena, m.data() + t.state,
                        v.data() + t.state, t.n, h);
      }
      EXPECT_TRUE(all_close(dp.read(), p, 0.0)) << "params, skew " << skew;
      EXPECT_TRUE(all_close(dm.read(), m, 0.0)) << "m, skew " << skew;
      EXPECT_TRUE(all_close(dv.read(), v, 0.0)) << "v, skew " << skew;
      const std::vector<float> w = dw.read();
      for (const kern::AdamWTensor& t : tensors)
        for (std::size_t k = t.arena; k < t.arena + t.n; ++k) {
          if (with_weights)
            ASSERT_EQ(w[k], rounded<T>({p[k]})[0]) << "weights at " << k;
          else
            ASSERT_TRUE(std::isnan(w[k])) << "weights written though null";
        }
      // The gaps between tensors are not touched: still poison.
      ASSERT_TRUE(std::isnan(w[tensors[0].n])) << "a gap's weight written";
    }
}

// The sum over many arrays against the CPU's: an empty list (a memset), an empty array
// among others; arrays of one element, of one block, of many; and 150 arrays (three
// launches) of very different sizes.
TEST(EmulatedOptimizerFp64, SumSquaresMatchesCpu) {
  ops::CpuOps cpu(1);
  std::vector<std::vector<std::size_t>> cases = {{}, {0}, {1}, {255, 0, 1001},
                                                 {70000}, {1024 * 256 + 1001, 3}};
  cases.emplace_back();
  for (std::size_t i = 0; i < 150; ++i) cases.back().push_back(i % 7 == 0 ? 50000 + i : 1 + i * 13);
  for (const auto& sizes : cases) {
    std::vector<std::vector<float>> xs;
    std::vector<std::unique_ptr<Device<float>>> dxs;
    std::vector<kern::SquaredArray> arrays;
    std::vector<ops::Span> spans;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      xs.push_back(randn(sizes[i], 5 + unsigned(i), 3.0f));
      dxs.push_back(std::make_unique<Device<float>>(xs.back()));
      arrays.push_back({dxs.back()->get(), sizes[i]});
      spans.push_back({xs.back().data(), sizes[i]});
    }
    Device<double> out(1), partials(kern::sum_squares_partials(sizes.size()));
    const unsigned long long launches = pptrain_emu::launch_count();
    kern::sum_squares(out.get(), arrays, partials.get(), nullptr);
    if (sizes.size() == 150)
      EXPECT_EQ(pptrain_emu::launch_count() - launches, 4u) << "a launch per 64 arrays, and one";
    const double want = cpu.sum_squares(spans);
    EXPECT_NEAR(out.raw()[0], want, 1e-12 * want) << sizes.size() << " arrays";
  }
}

}  // namespace
}  // namespace pptrain::emulation_test
