// Vocab-parallel ops split over simulated tensor-parallel shards (the all-reduces
// done by hand) must agree with the unsplit ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops {
namespace {

using testing::randn;

TEST(VocabParallel, CrossEntropyShardsMatchFusedLoss) {
  auto ops = std::make_unique<CpuOps>(1);
  const int N = 6, V = 37, Vp = 64;  // padding inside the last shard
  for (int shards : {1, 2, 4}) {
    const int Vl = Vp / shards;
    std::vector<float> logits = randn(size_t(N) * Vp, 5, 3.0f);
    const std::vector<int32_t> targets = {0, 36, 5, 17, 31, 16};
    std::vector<float> losses(N), dl(size_t(N) * Vp);
    ops->cross_entropy(losses.data(), dl.data(), logits.data(), targets.data(), N, V, Vp, 0.25f);

    // Column shards of the logits, as each tp rank would hold them.
    std::vector<std::vector<float>> shard(shards, std::vector<float>(size_t(N) * Vl));
    for (int s = 0; s < shards; ++s)
      for (int n = 0; n < N; ++n)
        std::copy_n(&logits[size_t(n) * Vp + s * Vl], Vl, &shard[s][size_t(n) * Vl]);
    std::vector<float> rowmax(N, -INFINITY), part(N), stats(2 * N, 0.0f), pstats(2 * N);
    for (int s = 0; s < shards; ++s) {  // phase 1 + all-reduce MAX
      ops->ce_row_max(part.data(), shard[s].data(), N, Vl, s * Vl, V);
      for (int n = 0; n < N; ++n) rowmax[n] = std::max(rowmax[n], part[n]);
    }
    for (int s = 0; s < shards; ++s) {  // phase 2 + all-reduce SUM
      ops->ce_partial_sums(pstats.data(), shard[s].data(), rowmax.data(), targets.data(), N, Vl,
                           s * Vl, V);
      for (int i = 0; i < 2 * N; ++i) stats[i] += pstats[i];
    }
    for (int s = 0; s < shards; ++s) {  // phase 3 on each shard, in place
      std::vector<float> shard_losses(N);
      ops->ce_finish(shard_losses.data(), shard[s].data(), shard[s].data(), rowmax.data(),
                     stats.data(), targets.data(), N, Vl, s * Vl, V, 0.25f);
      for (int n = 0; n < N; ++n) {
        EXPECT_NEAR(shard_losses[n], losses[n], 1e-6 * std::abs(losses[n])) << shards;
        for (int j = 0; j < Vl; ++j)
          EXPECT_NEAR(shard[s][size_t(n) * Vl + j], dl[size_t(n) * Vp + s * Vl + j], 1e-7)
              << "shards " << shards << " row " << n << " col " << s * Vl + j;
      }
    }
  }
}

TEST(VocabParallel, EmbeddingShardsSumToFullLookup) {
  auto ops = std::make_unique<CpuOps>(1);
  const int B = 2, T = 3, C = 4, V = 8;
  const std::vector<int32_t> tokens = {7, 0, 3, 4, 4, 1};
  const std::vector<float> wte = randn(size_t(V) * C, 8), wpe = randn(size_t(T) * C, 9);
  const std::vector<float> dout = randn(size_t(B) * T * C, 10);
  std::vector<float> full(size_t(B) * T * C), sum(full.size(), 0.0f), part(full.size());
  ops->embedding_forward(full.data(), tokens.data(), wte.data(), 0, V, wpe.data(), B, T, C);
  std::vector<float> dwte_full(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  ops->embedding_backward(dwte_full.data(), dwpe.data(), dout.data(), tokens.data(), 0, V, B, T, C);
  std::vector<float> dwte_sharded(wte.size(), 0.0f);
  for (int s = 0; s < 2; ++s) {
    const int rows = V / 2, begin = s * rows;
    ops->embedding_forward(part.data(), tokens.data(), wte.data() + size_t(begin) * C, begin, rows,
                           nullptr, B, T, C);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    ops->embedding_backward(dwte_sharded.data() + size_t(begin) * C, nullptr, dout.data(),
                            tokens.data(), begin, rows, B, T, C);
  }
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(sum[size_t(bt) * C + c] + wpe[size_t(bt % T) * C + c], full[size_t(bt) * C + c]);
  EXPECT_EQ(dwte_sharded, dwte_full);
}

}  // namespace
}  // namespace pptrain::ops
