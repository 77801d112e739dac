// Recomputation changes memory, never numbers: every mode, on one chunk and on two
// chunks of one rank, with W right after B (the fused backward of full recomputation)
// and with W deferred past later micro-batches, gives the losses and gradients of
// recompute: none bit for bit. The model's allocations match its activation table.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>
#include <vector>

#include "model/gpt.hpp"
#include "model_test_util.hpp"

namespace pptrain {
namespace {

ModelConfig model_config() {
  ModelConfig m;
  m.n_layer = 4;
  m.n_head = 2;
  m.d_model = 16;
  m.seq_len = 8;
  m.vocab_size = 50;
  return m;
}

ModelPartition two_chunks(const ModelConfig& m) {
  ModelPartition p;
  p.chunks = {{0, 2, true, false}, {2, m.n_layer, false, true}};
  return p;
}

struct Trained {
  std::vector<float> losses, grads;
};

// Three micro-batches: F0 F1 F2, then B and W of each; with `defer_w` every W comes
// after all the Bs (as zero-bubble schedules do), so sets wait between B and W.
Trained train(const ActivationPolicy& policy, bool chunks2, bool blocked_attention) {
  const ModelConfig m = model_config();
  auto ops = ops::make_cpu_ops(1, blocked_attention);
  const ModelPartition part = chunks2 ? two_chunks(m) : whole_model(m);
  GptModel model(m, 2, *ops, part, nullptr, policy);
  model.init_parameters(3);
  model.zero_grads();
  const int n = part.chunks.size() == 2 ? 2 : 1, micro = 3;
  std::vector<std::vector<std::unique_ptr<GptModel::Activations>>> sets{size_t(micro)};
  Trained r;
  const int N = 2 * m.seq_len;
  for (int mb = 0; mb < micro; ++mb) {
    auto in = test_support::tokens(N, m.vocab_size, 10 + mb);
    auto tg = test_support::tokens(N, m.vocab_size, 20 + mb);
    for (int c = 0; c < n; ++c) {
      sets[size_t(mb)].push_back(model.new_activations(c));
      const ops::Act* input = c == 0 ? nullptr : model.output(*sets[size_t(mb)][0]);
      const float loss = model.forward(c, *sets[size_t(mb)][size_t(c)], in.data(), input,
                                       tg.data(), 1.0f / micro);
      if (c == n - 1) r.losses.push_back(loss);
    }
  }
  auto backward_input = [&](int mb) {
    for (int c = n - 1; c >= 0; --c) {
      if (c < n - 1)
        ops->copy(model.output_grad(*sets[size_t(mb)][size_t(c)]),
                  model.input_grad(*sets[size_t(mb)][size_t(c) + 1]), model.boundary_bytes());
      model.backward_input(c, *sets[size_t(mb)][size_t(c)]);
    }
  };
  auto backward_weight = [&](int mb) {
    for (int c = n - 1; c >= 0; --c) model.backward_weight(c, *sets[size_t(mb)][size_t(c)]);
  };
  for (int mb = 0; mb < micro; ++mb) {
    backward_input(mb);
    if (policy.weight_follows_input) backward_weight(mb);
  }
  if (!policy.weight_follows_input)
    for (int mb = 0; mb < micro; ++mb) backward_weight(mb);
  r.grads.assign(model.grads(), model.grads() + model.layout().total_floats());
  return r;
}

using Case = std::tuple<Recompute, int, bool, bool, bool>;  // mode, layers, W follows, 2 chunks, blocked
class RecomputeTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeTest, LossesAndGradientsAreBitIdenticalToNone) {
  const auto [mode, layers, follows, chunks2, blocked] = GetParam();
  ActivationPolicy none, policy;
  none.weight_follows_input = policy.weight_follows_input = follows;
  policy.recompute = mode;
  policy.recompute_layers = layers;
  const Trained want = train(none, chunks2, blocked), got = train(policy, chunks2, blocked);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << i;
  ASSERT_EQ(got.grads.size(), want.grads.size());
  EXPECT_EQ(std::memcmp(got.grads.data(), want.grads.data(), want.grads.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RecomputeTest,
    ::testing::Combine(::testing::Values(Recompute::Selective, Recompute::Full),
                       ::testing::Values(0, 1), ::testing::Bool(), ::testing::Bool(),
                       ::testing::Bool()));

// The backend's allocations for one set are the table's Set part, and the peak over a
// step is the sets, the lent parts, the boundary arrays and the workspace the table gives.
TEST(ActivationTable, ModelAllocatesWhatTheTableLists) {
  const ModelConfig m = model_config();
  for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    auto ops = ops::make_cpu_ops(1);
    ActivationPolicy policy;
    policy.recompute = mode;
    GptModel model(m, 2, *ops, whole_model(m), nullptr, policy);
    const ChunkActivationLayout& L = model.activation_layout(0);
    const std::size_t before = ops->peak_memory_bytes();
    auto a = model.new_activations(0);
    EXPECT_EQ(ops->peak_memory_bytes() - before, L.part_bytes[int(Lifetime::Set)]);
    auto in = test_support::tokens(2 * m.seq_len, m.vocab_size, 1);
    model.forward(0, *a, in.data(), nullptr, in.data(), 1.0f);
    model.backward_input(0, *a);
    model.backward_weight(0, *a);
    // A chunk that is first and last holds all three boundary arrays during B.
    const std::size_t parts = L.part_bytes[int(Lifetime::Set)] +
                              L.part_bytes[int(Lifetime::UntilB)] +
                              L.part_bytes[int(Lifetime::FromB)] +
                              3 * L.part_bytes[int(Lifetime::Boundary)];
    EXPECT_EQ(ops->peak_memory_bytes(), before + parts) << name_of(mode);
  }
}

// What stays between F and B per layer, against the closed form of Korthikanti et al.
// in pptrain's terms (no dropout masks): bytes per element e, N = s*b tokens, h = C,
// a heads, t = tp; fp32 LayerNorm statistics 16 bytes per token.
TEST(ActivationTable, PerLayerBytesFollowTheClosedForm) {
  ActivationShape s;
  s.batch = 2;
  s.seq_len = 64;
  s.d_model = 128;
  s.tp = 2;
  s.heads = 8 / s.tp;
  s.act_bytes = 2;
  s.vocab_rows = 128;
  s.attention_state_bytes = std::size_t(s.batch) * s.heads * s.seq_len * s.seq_len * s.act_bytes;
  const double N = double(s.batch) * s.seq_len, h = s.d_model, t = s.tp, e = double(s.act_bytes);
  auto kept_per_layer = [&](const ActivationPolicy& p) {
    const ChunkActivationLayout L = chunk_activation_layout(s, p, 2, false, false);
    double bytes = 0;
    for (int k = 0; k < kLayerSlots; ++k) {
      const auto& w = L.at(1, Slot(k));
      if (w.life == Lifetime::Set || w.life == Lifetime::UntilB) bytes += double(w.bytes);
    }
    return bytes;
  };
  ActivationPolicy none, selective, full;
  selective.recompute = Recompute::Selective;
  full.recompute = Recompute::Full;
  // x, ln1, res2, ln2: 4h; atty h/t; qkv 3h/t; fch, fch_gelu 8h/t; probabilities a*s/t.
  const double probs = double(s.attention_state_bytes);
  EXPECT_EQ(kept_per_layer(none), N * h * e * (4 + 12 / t) + 16 * N + probs);
  EXPECT_EQ(kept_per_layer(selective), N * h * e * (4 + 12 / t) + 16 * N);
  EXPECT_EQ(kept_per_layer(full), N * h * e);  // the layer's input only
  // Sequence parallelism shards the rest too: everything divided by t, as in the paper.
  for (ActivationPolicy* p : {&none, &selective, &full}) p->sequence_parallel = true;
  EXPECT_EQ(kept_per_layer(none), (N * h * e * 16 + 16 * N) / t + probs);
  EXPECT_EQ(kept_per_layer(selective), (N * h * e * 16 + 16 * N) / t);
  EXPECT_EQ(kept_per_layer(full), N * h * e / t);
}

}  // namespace
}  // namespace pptrain
