// ZeRO-1 building blocks: AdamW restricted to arena ranges (shards) must update exactly
// as one AdamW over the whole arena, and shard norms must add up to the whole norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/random.hpp"
#include "optim/adamw.hpp"
#include "ops/ops.hpp"

namespace pptrain {
namespace {

// The CPU backend: its memory is host memory, so the arrays below are plain vectors.
ops::Ops& cpu() {
  static const std::unique_ptr<ops::Ops> backend = ops::make_cpu_ops(1);
  return *backend;
}

// A small GPT-2's arena: its layout, and parameters (twice) and gradients drawn from `seed`.
struct Arenas {
  ParamLayout layout;
  std::vector<float> p_whole, p_shard, g;
};
Arenas small_arenas(uint64_t seed) {
  ModelConfig m;
  m.n_layer = 2;
  m.d_model = 16;
  m.n_head = 2;
  m.seq_len = 8;
  m.vocab_size = 50;
  Arenas a{param_layout(m), {}, {}, {}};
  const size_t n = a.layout.total_floats();
  a.p_whole.resize(n);
  a.g.resize(n);
  for (size_t i = 0; i < n; ++i) {
    a.p_whole[i] = float(standard_normal(hash_words(seed, i)));
    a.g[i] = float(standard_normal(hash_words(seed + 1, i)));
  }
  a.p_shard = a.p_whole;
  return a;
}

TEST(AdamWShards, ShardedUpdatesMatchTheWholeArena) {
  auto [layout, p_whole, p_shard, g] = small_arenas(1);
  TrainConfig t;
  t.weight_decay = 0.1;
  const size_t n = layout.total_floats();
  AdamW whole(cpu(), layout, t);
  const size_t cut = n / 3 + 5;  // a cut inside a tensor
  AdamW first(cpu(), layout, t, {{0, cut}}), second(cpu(), layout, t, {{cut, n}});
  for (int step = 1; step <= 3; ++step) {
    whole.step(p_whole.data(), nullptr, g.data(), 1e-2f, 0.5f, step);
    first.step(p_shard.data(), nullptr, g.data(), 1e-2f, 0.5f, step);
    second.step(p_shard.data(), nullptr, g.data(), 1e-2f, 0.5f, step);
  }
  EXPECT_EQ(p_whole, p_shard);
  EXPECT_EQ(whole.exp_avg()[cut + 3], second.exp_avg()[3]);
  const auto all = [](const ParamEntry&) { return true; };
  const double parts = grad_square_sum(cpu(), layout, g.data(), all, 0, cut) +
                       grad_square_sum(cpu(), layout, g.data(), all, cut, n);
  EXPECT_NEAR(parts, grad_square_sum(cpu(), layout, g.data(), all), 1e-9 * parts);
}

// ZeRO's blocks: several ranges per rank, one rank's interleaved with another's; the
// moments of each range follow each other.
TEST(AdamWShards, RangesOfSeveralBucketsMatchTheWholeArena) {
  auto [layout, p_whole, p_shard, g] = small_arenas(3);
  TrainConfig t;
  const size_t n = layout.total_floats(), a = n / 5, b = n / 2, c = 3 * n / 4;
  AdamW whole(cpu(), layout, t);
  AdamW even(cpu(), layout, t, {{0, a}, {b, c}}), odd(cpu(), layout, t, {{a, b}, {c, n}});
  EXPECT_EQ(even.size(), a + (c - b));
  EXPECT_EQ(odd.moment_offset(1), b - a);
  for (int step = 1; step <= 3; ++step) {
    whole.step(p_whole.data(), nullptr, g.data(), 1e-2f, 1.0f, step);
    even.step(p_shard.data(), nullptr, g.data(), 1e-2f, 1.0f, step);
    odd.step_range(1, p_shard.data(), nullptr, g.data(), 1e-2f, 1.0f, step);
    odd.step_range(0, p_shard.data(), nullptr, g.data(), 1e-2f, 1.0f, step);
  }
  EXPECT_EQ(p_whole, p_shard);
  EXPECT_EQ(whole.exp_avg_sq()[c + 2], odd.exp_avg_sq()[odd.moment_offset(1) + 2]);
  EXPECT_EQ(whole.exp_avg()[b + 1], even.exp_avg()[even.moment_offset(1) + 1]);
}

// The distributed optimizer: the master weights are the optimizer's, its ranges packed
// like the moments; the update writes them and the caller's weight copy, and matches one
// AdamW over the whole arena.
TEST(AdamWShards, AnOptimizerHoldingTheMasterMatchesTheWholeArena) {
  auto [layout, p_whole, p_copy, g] = small_arenas(5);
  TrainConfig t;
  t.weight_decay = 0.1;
  const size_t n = layout.total_floats(), a = n / 3 + 7, b = 2 * n / 3;
  AdamW whole(cpu(), layout, t);
  AdamW mine(cpu(), layout, t, {{a, b}, {0, a / 2}}, /*holds_master=*/true);
  ASSERT_NE(mine.master(), nullptr);
  EXPECT_EQ(whole.master(), nullptr);
  mine.upload_ranges(mine.master(), p_whole.data());
  for (int step = 1; step <= 3; ++step) {
    whole.step(p_whole.data(), nullptr, g.data(), 1e-2f, 1.0f, step);
    mine.step(nullptr, ops::as_act(p_copy.data()), g.data(), 1e-2f, 1.0f, step);
  }
  for (size_t i = 0; i < b - a; ++i) ASSERT_EQ(mine.master()[i], p_whole[a + i]) << i;
  for (size_t i = 0; i < a / 2; ++i) ASSERT_EQ(mine.master()[mine.moment_offset(1) + i], p_whole[i]) << i;
  std::vector<bool> in_entry(n, false);
  for (const ParamEntry& e : layout.entries()) std::fill_n(in_entry.begin() + long(e.offset), e.numel, true);
  size_t others_kept = 0, others = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool owned = (i >= a && i < b) || i < a / 2;
    if (owned) ASSERT_EQ(p_copy[i], p_whole[i]) << i;  // the copy's owned elements updated
    if (owned || !in_entry[i]) continue;
    ++others;
    others_kept += p_copy[i] != p_whole[i];
  }
  EXPECT_EQ(others_kept, others);  // and no other
}

TEST(AdamWShards, TheMasterComesFromTheCallerOrTheOptimizerNotBoth) {
  auto [layout, p_whole, p_copy, g] = small_arenas(6);
  TrainConfig t;
  AdamW mine(cpu(), layout, t, {{0, 64}}, /*holds_master=*/true);
  EXPECT_THROW(mine.step(p_whole.data(), nullptr, g.data(), 1e-2f, 1.0f, 1), std::exception);
  AdamW theirs(cpu(), layout, t, {{0, 64}});
  EXPECT_THROW(theirs.step(nullptr, nullptr, g.data(), 1e-2f, 1.0f, 1), std::exception);
}

}  // namespace
}  // namespace pptrain
