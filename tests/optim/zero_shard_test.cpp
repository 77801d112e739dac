// ZeRO-1 building blocks: AdamW restricted to arena ranges (shards) must update exactly
// as one AdamW over the whole arena, and shard norms must add up to the whole norm.
#include <gtest/gtest.h>

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
  Arenas a{gpt_param_layout(m), {}, {}, {}};
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

}  // namespace
}  // namespace pptrain
