// The cross-entropy kernels (cross_entropy.cu) under the CUDA emulator against the CPU
// backend, for float and bf16 logits: the fused op (with and without the gradient, in
// place, padded columns) and the three vocab-parallel phases over shards of the columns,
// including shards of padding only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "emulated_kernels.hpp"
#include "emulation_test_util.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::emulation_test {
namespace {

template <typename T>
class EmulatedLoss : public ::testing::Test {
 protected:
  ops::CpuOps cpu{1};
};
TYPED_TEST_SUITE(EmulatedLoss, ElementTypes, ElementTypeNames);

std::vector<int32_t> make_targets(int N, int V) {
  std::vector<int32_t> t(N);
  for (int n = 0; n < N; ++n) t[n] = (n * 13 + 3) % V;
  return t;
}

// (N, V, Vp, skew): padded odd rows, rows that take the packs, rows longer than a block's
// stride, misaligned logits.
constexpr int kShapes[][4] = {{5, 37, 40, 0}, {3, 61, 64, 0}, {4, 1000, 1024, 0}, {3, 61, 64, 1}};

TYPED_TEST(EmulatedLoss, CrossEntropyMatchesCpu) {
  using T = TypeParam;
  for (const auto& [N, V, Vp, skew] : kShapes)
    for (int mode : {0, 1, 2}) {  // gradient into its own array, in place, none
      const std::size_t n = std::size_t(N) * Vp;
      const std::vector<float> logits = rounded<T>(randn(n, 1, 3.0f));
      const std::vector<int32_t> targets = make_targets(N, V);
      const float dloss = 1.0f / N;
      Device<T> dlogits(logits, skew), dgrad(n, skew);
      Device<int32_t> dtargets(targets);
      Device<float> losses(N);
      T* grad = mode == 0 ? dgrad.get() : mode == 1 ? dlogits.get() : nullptr;
      kern::cross_entropy<T>(losses.get(), grad, dlogits.get(), dtargets.get(), N, V, Vp, dloss,
                             nullptr);
      std::vector<float> want_losses(N), want_grad(n);
      this->cpu.cross_entropy(want_losses.data(), mode == 2 ? nullptr : want_grad.data(),
                              logits.data(), targets.data(), N, V, Vp, dloss);
      EXPECT_TRUE(all_close(losses.read(), want_losses, 1e-5))
          << V << "/" << Vp << " mode " << mode;
      if (mode == 2) continue;
      const std::vector<float> got = mode == 0 ? dgrad.read() : dlogits.read();
      EXPECT_TRUE(all_close(got, rounded<T>(want_grad), tol<T>(1e-5, 1e-2)))
          << V << "/" << Vp << " mode " << mode;
    }
}

// Columns [s * Vl, (s + 1) * Vl) of the [N, Vp] rows.
std::vector<float> shard_of(const std::vector<float>& x, int N, int Vp, int s, int Vl) {
  std::vector<float> out(std::size_t(N) * Vl);
  for (int n = 0; n < N; ++n)
    std::copy_n(x.begin() + std::size_t(n) * Vp + std::size_t(s) * Vl, Vl,
                out.begin() + std::size_t(n) * Vl);
  return out;
}

TYPED_TEST(EmulatedLoss, VocabParallelPhasesMatchCpu) {
  using T = TypeParam;
  // (N, V, Vl, shards): odd shards with one of padding only; pack-wide shards with two of
  // padding only; a shard split inside the real columns.
  const int cases[][4] = {{5, 35, 12, 4}, {3, 60, 64, 3}, {4, 100, 64, 2}};
  for (const auto& [N, V, Vl, S] : cases) {
    const int Vp = Vl * S;
    const std::vector<float> logits = rounded<T>(randn(std::size_t(N) * Vp, 2, 3.0f));
    const std::vector<int32_t> targets = make_targets(N, V);
    const float dloss = 0.5f;
    Device<int32_t> dtargets(targets);
    // Phase 1 per shard (its stats kept for phase 2), then the max over shards (the
    // all-reduce, here on the host).
    std::vector<float> rowmax(N, -INFINITY);
    std::vector<std::vector<float>> own_stats;
    for (int s = 0; s < S; ++s) {
      const std::vector<float> part = shard_of(logits, N, Vp, s, Vl);
      Device<T> dpart(part);
      Device<float> dmax(N), dstats(2 * std::size_t(N));
      kern::ce_row_max<T>(dmax.get(), dstats.get(), dpart.get(), N, Vl, s * Vl, V, nullptr);
      own_stats.push_back(dstats.read());
      std::vector<float> want(N);
      this->cpu.ce_row_max(want.data(), part.data(), N, Vl, s * Vl, V);
      EXPECT_TRUE(all_close(dmax.read(), want, 0.0)) << "row max, shard " << s;
      for (int n = 0; n < N; ++n) rowmax[n] = std::max(rowmax[n], want[n]);
    }
    // Phase 2 per shard, summed over shards.
    std::vector<float> stats(2 * std::size_t(N), 0.0f);
    for (int s = 0; s < S; ++s) {
      const std::vector<float> part = shard_of(logits, N, Vp, s, Vl);
      Device<T> dpart(part);
      Device<float> dmax(rowmax), dstats(own_stats[std::size_t(s)]);
      kern::ce_partial_sums<T>(dstats.get(), dpart.get(), dmax.get(), dtargets.get(), N, Vl, s * Vl,
                               V, nullptr);
      std::vector<float> want(2 * std::size_t(N));
      this->cpu.ce_partial_sums(want.data(), part.data(), rowmax.data(), targets.data(), N, Vl,
                                s * Vl, V);
      EXPECT_TRUE(all_close(dstats.read(), want, 1e-5)) << "partial sums, shard " << s;
      for (std::size_t i = 0; i < stats.size(); ++i) stats[i] += want[i];
    }
    // Phase 3 per shard: losses and the shard's gradient (own array, in place, none).
    std::vector<float> full_losses(N);
    this->cpu.cross_entropy(full_losses.data(), nullptr, logits.data(), targets.data(), N, V, Vp,
                            dloss);
    for (int s = 0; s < S; ++s)
      for (int mode : {0, 1, 2}) {
        const std::vector<float> part = shard_of(logits, N, Vp, s, Vl);
        Device<T> dpart(part), dgrad(part.size());
        Device<float> dmax(rowmax), dstats(stats), losses(N);
        T* grad = mode == 0 ? dgrad.get() : mode == 1 ? dpart.get() : nullptr;
        kern::ce_finish<T>(losses.get(), grad, dpart.get(), dmax.get(), dstats.get(),
                           dtargets.get(), N, Vl, s * Vl, V, dloss, nullptr);
        std::vector<float> want_losses(N), want_grad(part.size());
        this->cpu.ce_finish(want_losses.data(), mode == 2 ? nullptr : want_grad.data(), part.data(),
                            rowmax.data(), stats.data(), targets.data(), N, Vl, s * Vl, V, dloss);
        EXPECT_TRUE(all_close(losses.read(), want_losses, 1e-5)) << "finish, shard " << s;
        EXPECT_TRUE(all_close(losses.read(), full_losses, 1e-5)) << "vs the fused loss";
        if (mode == 2) continue;
        const std::vector<float> got = mode == 0 ? dgrad.read() : dpart.read();
        EXPECT_TRUE(all_close(got, rounded<T>(want_grad), tol<T>(1e-5, 1e-2)))
            << "finish gradient, shard " << s << " mode " << mode;
      }
  }
}

}  // namespace
}  // namespace pptrain::emulation_test
