// Whole-model tests: finite-difference gradients through the full GPT, split
// backward equivalences, gradient accumulation, initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/random.hpp"
#include "model/gpt.hpp"
#include "model_test_util.hpp"

namespace pptrain {
namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 8;
  m.seq_len = 5;
  m.vocab_size = 11;  // padded to 128: exercises the masked logits
  return m;
}

using test_support::tokens;

struct Fixture {
  explicit Fixture(int batch, ModelConfig m = tiny_model())
      : ops(ops::make_cpu_ops(1)), model(m, batch, *ops) {
    model.init_parameters(7);
    // Non-trivial LayerNorm and bias values so their gradients are exercised.
    for (const ParamEntry& e : model.layout().entries()) {
      if (e.name.find("weight") != std::string::npos && e.name.find("ln_") == std::string::npos)
        continue;
      for (size_t i = 0; i < e.hf_numel(); ++i)
        model.params()[e.offset + i] += float(0.1 * standard_normal(hash_words(99, e.offset + i)));
    }
  }
  std::unique_ptr<ops::Ops> ops;
  GptModel model;
};

TEST(GptModel, WholeModelGradientMatchesFiniteDifferences) {
  const int B = 2;
  Fixture f(B);
  const ModelConfig& m = f.model.config();
  auto in = tokens(B * m.seq_len, m.vocab_size, 1), tg = tokens(B * m.seq_len, m.vocab_size, 2);
  in[3] = in[7];  // a repeated token: embedding gradients must accumulate
  f.model.zero_grads();
  f.model.forward(in.data(), tg.data(), 1.0f);
  f.model.backward_input();
  f.model.backward_weight();
  std::vector<float> analytic(f.model.grads(), f.model.grads() + f.model.layout().total_floats());

  // Every tensor: check a handful of elements by central differences.
  int checked = 0;
  double worst = 0;
  for (const ParamEntry& e : f.model.layout().entries()) {
    for (int k = 0; k < 4; ++k) {
      const size_t i = e.offset + mix64(e.offset * 31 + k) % e.hf_numel();
      float* p = f.model.params() + i;
      const float saved = *p, h = 1e-2f;
      *p = saved + h;
      const double up = f.model.forward(in.data(), tg.data());
      *p = saved - h;
      const double down = f.model.forward(in.data(), tg.data());
      *p = saved;
      const double numeric = (up - down) / (2.0 * h);
      const double err = std::abs(numeric - analytic[i]) / (1e-3 + std::abs(numeric));
      worst = std::max(worst, err);
      EXPECT_LT(err, 3e-2) << e.name << "[" << i - e.offset << "] analytic " << analytic[i]
                           << " numeric " << numeric;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * int(f.model.layout().entries().size()));
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST(GptModel, PaddedVocabRowsGetNoGradient) {
  Fixture f(1);
  const ModelConfig& m = f.model.config();
  auto in = tokens(m.seq_len, m.vocab_size, 3), tg = tokens(m.seq_len, m.vocab_size, 4);
  f.model.zero_grads();
  f.model.forward(in.data(), tg.data(), 1.0f);
  f.model.backward_input();
  f.model.backward_weight();
  const ParamEntry& wte = f.model.layout().at("transformer.wte.weight");
  for (size_t i = wte.hf_numel(); i < wte.numel; ++i)
    ASSERT_EQ(f.model.grads()[wte.offset + i], 0.0f) << i;
}

TEST(GptModel, AccumulatedMicroBatchesEqualOneBatch) {
  // One batch of two sequences == two micro-batches of one, each with loss scale 1/2.
  const ModelConfig m = tiny_model();
  auto in = tokens(2 * m.seq_len, m.vocab_size, 5), tg = tokens(2 * m.seq_len, m.vocab_size, 6);
  Fixture both(2), single(1);
  both.model.zero_grads();
  const float loss2 = both.model.forward(in.data(), tg.data(), 1.0f);
  both.model.backward_input();
  both.model.backward_weight();
  single.model.zero_grads();
  float loss_sum = 0;
  for (int mb = 0; mb < 2; ++mb) {
    loss_sum += single.model.forward(in.data() + mb * m.seq_len, tg.data() + mb * m.seq_len, 0.5f);
    single.model.backward_input();
    single.model.backward_weight();
  }
  EXPECT_NEAR(loss2, loss_sum / 2, 1e-6);
  const size_t n = both.model.layout().total_floats();
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(both.model.grads()[i], single.model.grads()[i],
                1e-5 * (1 + std::abs(both.model.grads()[i])))
        << i;
}

TEST(GptModel, EvaluationForwardMatchesTrainingForward) {
  Fixture f(2);
  const ModelConfig& m = f.model.config();
  auto in = tokens(2 * m.seq_len, m.vocab_size, 8), tg = tokens(2 * m.seq_len, m.vocab_size, 9);
  const float eval = f.model.forward(in.data(), tg.data());
  const float train = f.model.forward(in.data(), tg.data(), 1.0f);
  EXPECT_EQ(eval, train);
}

TEST(GptModel, InitialisationFollowsGpt2) {
  ModelConfig m = tiny_model();
  m.n_layer = 4;
  m.d_model = 64;
  m.n_head = 4;
  Fixture f(1, m);
  f.model.init_parameters(11);
  auto stddev = [&](const std::string& name) {
    const ParamEntry& e = f.model.layout().at(name);
    double s = 0;
    for (size_t i = 0; i < e.hf_numel(); ++i) s += double(f.model.params()[e.offset + i]) * f.model.params()[e.offset + i];
    return std::sqrt(s / double(e.hf_numel()));
  };
  EXPECT_NEAR(stddev("transformer.h.0.mlp.c_fc.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("transformer.h.1.attn.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.001);
  EXPECT_NEAR(stddev("transformer.wte.weight"), 0.02, 0.003);
  const ParamEntry& ln = f.model.layout().at("transformer.h.2.ln_1.weight");
  for (size_t i = 0; i < ln.numel; ++i) EXPECT_EQ(f.model.params()[ln.offset + i], 1.0f);
  EXPECT_EQ(stddev("transformer.h.3.mlp.c_fc.bias"), 0.0);
  const ParamEntry& wte = f.model.layout().at("transformer.wte.weight");
  for (size_t i = wte.hf_numel(); i < wte.numel; ++i) ASSERT_EQ(f.model.params()[wte.offset + i], 0.0f);

  // Same seed, same values; another seed, other values.
  std::vector<float> first(f.model.params(), f.model.params() + f.model.layout().total_floats());
  f.model.init_parameters(11);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), f.model.params()));
  f.model.init_parameters(12);
  EXPECT_FALSE(std::equal(first.begin(), first.end(), f.model.params()));
}

TEST(GptModel, LayoutUsesGpt2NamesAndShapes) {
  ModelConfig m;
  m.n_layer = 12;
  m.n_head = 12;
  m.d_model = 768;
  m.seq_len = 1024;
  m.vocab_size = 50257;
  const ParamLayout layout = param_layout(m);
  EXPECT_EQ(layout.hf_param_count(), 124439808);  // GPT-2 small
  EXPECT_EQ(layout.at("transformer.wte.weight").hf_shape, (std::vector<int64_t>{50257, 768}));
  EXPECT_EQ(layout.at("transformer.wte.weight").shape, (std::vector<int64_t>{50304, 768}));
  EXPECT_EQ(layout.at("transformer.h.11.attn.c_attn.weight").shape,
            (std::vector<int64_t>{768, 2304}));
  for (const ParamEntry& e : layout.entries()) EXPECT_EQ(e.offset % 64, 0u) << e.name;
}

}  // namespace
}  // namespace pptrain

namespace pptrain {
namespace {

TEST(TensorParallelLayout, ShardsTileTheGlobalTensors) {
  ModelConfig m;
  m.n_layer = 1;
  m.n_head = 4;
  m.d_model = 8;
  m.seq_len = 4;
  m.vocab_size = 300;  // padded to 512 for tp=2: shard 1 holds rows 256..511, real up to 299
  const ParamLayout unsplit = param_layout(m);
  for (const ParamEntry& whole : unsplit.entries()) {
    std::vector<float> global(whole.hf_numel()), rebuilt(whole.hf_numel(), -1.0f);
    for (size_t i = 0; i < global.size(); ++i) global[i] = float(i);
    for (int r = 0; r < 2; ++r) {
      ModelPartition part = whole_model(m);
      part.tp_size = 2;
      part.tp_rank = r;
      const ParamLayout shard_layout = param_layout(m, part);
      const ParamEntry& e = shard_layout.at(whole.name);
      std::vector<float> local(e.numel);
      slice_from_global(e, global.data(), local.data());
      slice_to_global(e, local.data(), rebuilt.data());
      if (whole.name == "transformer.h.0.attn.c_attn.weight" && r == 1) {
        // Row 0, local column 0 of each of q|k|v is global column g*8 + 4.
        EXPECT_EQ(e.shape, (std::vector<int64_t>{8, 12}));
        EXPECT_EQ(local[0], 4.0f);
        EXPECT_EQ(local[4], 12.0f);
        EXPECT_EQ(local[8], 20.0f);
        EXPECT_EQ(local[12], 24.0f + 4.0f);  // row 1
      }
      if (whole.name == "transformer.wte.weight") {
        EXPECT_EQ(e.shape, (std::vector<int64_t>{256, 8}));
        if (r == 1) {
          EXPECT_EQ(local[0], float(256 * 8));   // first row of shard 1 is global row 256
          EXPECT_EQ(local[44 * 8], 0.0f);        // global row 300: padding
        }
      }
    }
    EXPECT_EQ(rebuilt, global) << whole.name;  // the two shards cover every element
  }
}

TEST(TensorParallelLayout, FillsFromGlobalIndicesLikeTheSlice) {
  // Runs longer than the 16384-element chunks, padding rows, and column groups.
  ModelConfig m;
  m.n_layer = 1;
  m.n_head = 4;
  m.d_model = 64;
  m.seq_len = 4;
  m.vocab_size = 1000;  // padded to 1024 for tp=2
  for (int tp : {1, 2}) {
    for (int r = 0; r < tp; ++r) {
      ModelPartition part = whole_model(m);
      part.tp_size = tp;
      part.tp_rank = r;
      const ParamLayout layout = param_layout(m, part);
      for (const ParamEntry& e : layout.entries()) {
        std::vector<float> global(e.hf_numel());
        for (size_t i = 0; i < global.size(); ++i) global[i] = float(i) + 0.5f;
        std::vector<float> sliced(e.numel), by_element(e.numel, -1.0f), by_run(e.numel, -1.0f);
        slice_from_global(e, global.data(), sliced.data());
        fill_from_global(e, [](int64_t g) { return float(g) + 0.5f; }, by_element.data());
        fill_runs_from_global(
            e,
            [](int64_t first, int64_t count, float* out) {
              for (int64_t k = 0; k < count; ++k) out[k] = float(first + k) + 0.5f;
            },
            by_run.data());
        EXPECT_EQ(by_element, sliced) << e.name << " tp " << tp << " rank " << r;
        EXPECT_EQ(by_run, sliced) << e.name << " tp " << tp << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace pptrain
