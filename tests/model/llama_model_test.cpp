// Whole-model tests of the llama block: finite-difference gradients through RMSNorm,
// rotary embedding, grouped-query attention, SwiGLU and a tied or untied head; Hugging
// Face's names and shapes; its initialisation; what the config refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "config/config.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "model/llama.hpp"
#include "model_test_util.hpp"

namespace pptrain {
namespace {

using test_support::tokens;

ModelConfig tiny_llama(bool tied) {
  ModelConfig m;
  m.arch = Arch::Llama;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 16;
  m.ffn_hidden = 24;
  m.seq_len = 5;
  m.vocab_size = 11;  // padded to 128: exercises the masked logits
  m.rope_theta = 100.0;  // turns fast enough that 5 positions rotate far
  m.tie_embeddings = tied;
  return m;
}

class LlamaModelTest : public ::testing::TestWithParam<bool> {};

TEST_P(LlamaModelTest, WholeModelGradientMatchesFiniteDifferences) {
  const int B = 2;
  auto ops = ops::make_cpu_ops(1);
  LlamaModel model(tiny_llama(GetParam()), B, *ops, whole_model(tiny_llama(GetParam())));
  model.init_parameters(7);
  // Norm weights away from 1 and larger weights, so every path carries gradient.
  for (const ParamEntry& e : model.layout().entries())
    for (size_t i = 0; i < e.hf_numel(); ++i)
      model.params()[e.offset + i] += float((e.layer_norm ? 0.3 : 0.1) *
                                            standard_normal(hash_words(99, e.offset + i)));
  const ModelConfig& m = model.config();
  auto in = tokens(B * m.seq_len, m.vocab_size, 1), tg = tokens(B * m.seq_len, m.vocab_size, 2);
  in[3] = in[7];  // a repeated token: embedding gradients must accumulate
  model.zero_grads();
  model.forward(in.data(), tg.data(), 1.0f);
  model.backward_input();
  model.backward_weight();
  std::vector<float> analytic(model.grads(), model.grads() + model.layout().total_floats());
  int checked = 0;
  for (const ParamEntry& e : model.layout().entries()) {
    for (int k = 0; k < 6; ++k) {
      const size_t i = e.offset + mix64(e.offset * 31 + k) % e.hf_numel();
      float* p = model.params() + i;
      const float saved = *p, h = 1e-2f;
      *p = saved + h;
      const double up = model.forward(in.data(), tg.data());
      *p = saved - h;
      const double down = model.forward(in.data(), tg.data());
      *p = saved;
      const double numeric = (up - down) / (2.0 * h);
      const double err = std::abs(numeric - analytic[i]) / (1e-3 + std::abs(numeric));
      EXPECT_LT(err, 3e-2) << e.name << "[" << i - e.offset << "] analytic " << analytic[i]
                           << " numeric " << numeric;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * int(model.layout().entries().size()));
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, LlamaModelTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "tied" : "untied"; });

// LlamaForCausalLM's tensors: nn.Linear weights (out, in), k/v of n_kv_head heads, the
// head its own tensor unless tied; q|k|v and gate|up each one run of the arena.
TEST(LlamaLayout, UsesHuggingFaceNamesAndShapes) {
  const ModelConfig m = tiny_llama(false);
  const ParamLayout layout = param_layout(m);
  const int64_t C = 16, Ckv = 8, F = 24, V = 11;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"model.embed_tokens.weight", {V, C}},
      {"model.layers.0.input_layernorm.weight", {C}},
      {"model.layers.0.self_attn.q_proj.weight", {C, C}},
      {"model.layers.0.self_attn.k_proj.weight", {Ckv, C}},
      {"model.layers.0.self_attn.v_proj.weight", {Ckv, C}},
      {"model.layers.0.self_attn.o_proj.weight", {C, C}},
      {"model.layers.0.post_attention_layernorm.weight", {C}},
      {"model.layers.0.mlp.gate_proj.weight", {F, C}},
      {"model.layers.0.mlp.up_proj.weight", {F, C}},
      {"model.layers.0.mlp.down_proj.weight", {C, F}},
      {"model.norm.weight", {C}},
      {"lm_head.weight", {V, C}}};
  for (const auto& [name, shape] : want) EXPECT_EQ(layout.at(name).hf_shape, shape) << name;
  EXPECT_EQ(layout.entries().size(), 1 + 2 * 9 + 2u);
  const ParamEntry &q = layout.at("model.layers.1.self_attn.q_proj.weight"),
                   &k = layout.at("model.layers.1.self_attn.k_proj.weight"),
                   &v = layout.at("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(k.offset, q.offset + q.numel);
  EXPECT_EQ(v.offset, k.offset + k.numel);
  EXPECT_EQ(layout.at("model.layers.1.mlp.up_proj.weight").offset,
            layout.at("model.layers.1.mlp.gate_proj.weight").offset + std::size_t(F * C));
  EXPECT_FALSE(param_layout(tiny_llama(true)).contains("lm_head.weight"));
  // Parameters: embed, lm_head, final norm, and per layer 2 norms, q, k, v, o, 3 MLP.
  EXPECT_EQ(layout.hf_param_count(), 2 * V * C + C + 2 * (2 * C + C * C + 2 * Ckv * C + C * C + 3 * F * C));
}

// tp 2: each rank holds half the query heads, half the key/value heads and half the MLP's
// columns; o_proj and down_proj are split along their input columns.
TEST(LlamaLayout, TensorParallelSplitsHeadsAndColumns) {
  const ModelConfig m = tiny_llama(false);
  ModelPartition part = whole_model(m);
  part.tp_size = 2;
  part.tp_rank = 1;
  const ParamLayout layout = param_layout(m, part);
  EXPECT_EQ(layout.at("model.layers.0.self_attn.q_proj.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(layout.at("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(layout.at("model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(layout.at("model.layers.0.self_attn.o_proj.weight").split_dim, 1);
  EXPECT_EQ(layout.at("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(layout.at("lm_head.weight").split_dim, 0);
}

// Hugging Face's _init_weights: N(0, 0.02) for every linear and embedding, norms 1.
TEST(LlamaModelInit, FollowsHuggingFace) {
  auto ops = ops::make_cpu_ops(1);
  ModelConfig m = tiny_llama(false);
  m.d_model = 64;
  m.ffn_hidden = 128;
  LlamaModel model(m, 1, *ops, whole_model(m));
  model.init_parameters(3);
  for (const ParamEntry& e : model.layout().entries()) {
    const float* p = model.params() + e.offset;
    if (e.layer_norm) {
      for (size_t i = 0; i < e.numel; ++i) ASSERT_EQ(p[i], 1.0f) << e.name;
      continue;
    }
    double sq = 0;
    for (size_t i = 0; i < e.hf_numel(); ++i) sq += double(p[i]) * p[i];
    EXPECT_NEAR(std::sqrt(sq / double(e.hf_numel())), 0.02, 0.004) << e.name;
  }
}

// What the config refuses for each arch, one line naming the key.
TEST(LlamaConfig, RefusesInconsistentKeys) {
  const std::string llama = "model: {arch: llama, n_head: 4, d_model: 64}\n";
  const Config c = parse_config(llama, "t.yaml");
  EXPECT_EQ(c.model.n_kv_head, 4);
  EXPECT_EQ(c.model.ffn_hidden, 256);  // 8/3 * 64 rounded up to 256
  EXPECT_FALSE(c.model.tie_embeddings);
  const std::pair<std::string, std::string> bad[] = {
      {llama + "", "model.n_kv_head=3"},                       // does not divide n_head
      {llama + "", "model.rope_theta=0"},
      {llama + "", "model.norm_eps=-1"},
      {"model: {arch: llama, n_head: 4, d_model: 12}\n", ""},  // odd head size (3)
      {llama + "parallel: {tp: 4}\n", "model.n_kv_head=2"},    // tp must divide n_kv_head
      {"model: {n_head: 4, d_model: 64}\n", "model.n_kv_head=2"},  // gpt2: no GQA
      {"model: {n_head: 4, d_model: 64}\n", "model.tie_embeddings=false"},
      {"model: {n_head: 4, d_model: 64}\n", "model.rope_theta=500000"},
      {"model: {n_head: 4, d_model: 64}\n", "model.ffn_hidden=100"},
      {"model: {n_head: 4, d_model: 64}\n", "model.arch=bert"},
  };
  for (const auto& [yaml, set] : bad) {
    std::vector<std::string> sets;
    if (!set.empty()) sets.push_back(set);
    EXPECT_THROW(parse_config(yaml, "t.yaml", sets), InputError) << yaml << " " << set;
  }
}

}  // namespace
}  // namespace pptrain
