// ZeRO-1 building blocks: AdamW restricted to arena ranges (shards) must update exactly
// as one AdamW over the whole arena, and shard norms must add up to the whole norm.
#include <gtest/gtest.h>

#include <vector>

#include "core/random.hpp"
#include "optim/adamw.hpp"

namespace pptrain {
namespace {

TEST(AdamWShards, ShardedUpdatesMatchTheWholeArena) {
  ModelConfig m;
  m.n_layer = 2;
  m.d_model = 16;
  m.n_head = 2;
  m.seq_len = 8;
  m.vocab_size = 50;
  const ParamLayout layout = gpt_param_layout(m);
  TrainConfig t;
  t.weight_decay = 0.1;
  const size_t n = layout.total_floats();
  std::vector<float> p_whole(n), p_shard(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p_whole[i] = p_shard[i] = float(standard_normal(hash_words(1, i)));
    g[i] = float(standard_normal(hash_words(2, i)));
  }
  AdamW whole(layout, t);
  const size_t cut = n / 3 + 5;  // a cut inside a tensor
  AdamW first(layout, t, 0, cut), second(layout, t, cut, n);
  for (int step = 1; step <= 3; ++step) {
    whole.step(p_whole.data(), g.data(), 1e-2f, 0.5f, step);
    first.step(p_shard.data(), g.data(), 1e-2f, 0.5f, step);
    second.step(p_shard.data(), g.data(), 1e-2f, 0.5f, step);
  }
  EXPECT_EQ(p_whole, p_shard);
  EXPECT_EQ(whole.exp_avg()[cut + 3], second.exp_avg()[3]);
  const auto all = [](const ParamEntry&) { return true; };
  const double parts = grad_square_sum(layout, g.data(), all, 0, cut) +
                       grad_square_sum(layout, g.data(), all, cut, n);
  EXPECT_NEAR(parts, grad_square_sum(layout, g.data(), all), 1e-9 * parts);
}

}  // namespace
}  // namespace pptrain
