// The model's mixed-precision path (bf16 activations and weight copy; fp32 master
// weights, gradients and AdamW moments) on the bf16-storage CPU test backend, against
// the fp32 CPU backend: the same GPT must give the same loss and gradients up to bf16
// rounding, train alike, and keep its weight copy equal to the rounded master.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "bf16_cpu_ops.hpp"
#include "core/random.hpp"
#include "model/gpt.hpp"
#include "model_test_util.hpp"
#include "optim/adamw.hpp"

namespace pptrain {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 32;
  m.seq_len = 16;
  m.vocab_size = 61;
  return m;
}

using test_support::tokens;

struct Trainee {
  explicit Trainee(std::unique_ptr<ops::Ops> backend, int batch = 2)
      : ops(std::move(backend)), model(small_model(), batch, *ops) {
    model.init_parameters(3);
  }
  // Loss of one training forward, gradients left in grads() (host copy returned).
  float loss_and_grads(const std::vector<int32_t>& in, const std::vector<int32_t>& tg,
                       std::vector<float>* grads) {
    model.zero_grads();
    const float loss = model.forward(in.data(), tg.data(), 1.0f);
    model.backward_input();
    model.backward_weight();
    grads->resize(model.layout().total_floats());
    ops->download(grads->data(), model.grads(), grads->size() * sizeof(float));
    return loss;
  }
  std::unique_ptr<ops::Ops> ops;
  GptModel model;
};

// The bf16 weight copy must hold exactly the master rounded to bf16.
void expect_copy_is_rounded_master(Trainee& t) {
  const size_t n = t.model.layout().total_floats();
  std::vector<float> master(n), copy(n);
  t.model.read_params(master.data());
  t.ops->to_float(copy.data(), t.model.weights(), n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(copy[i], test_support::from_bf16(test_support::to_bf16(master[i]))) << i;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

TEST(MixedPrecision, Bf16HasAWeightCopyAndFp32DoesNot) {
  Trainee bf(test_support::make_bf16_cpu_ops()), fp(ops::make_cpu_ops(1));
  EXPECT_TRUE(bf.model.has_weight_copy());
  EXPECT_FALSE(fp.model.has_weight_copy());
}

TEST(MixedPrecision, WeightCopyIsTheRoundedMaster) {
  Trainee bf(test_support::make_bf16_cpu_ops());
  expect_copy_is_rounded_master(bf);
  // Master values that bf16 cannot hold stay exact in the master.
  std::vector<float> master(bf.model.layout().total_floats()), back(master.size());
  for (size_t i = 0; i < master.size(); ++i) master[i] = 1.0f + float(i % 7) * 1e-4f;
  bf.model.write_params(master.data());
  bf.model.read_params(back.data());
  EXPECT_EQ(back, master);
  expect_copy_is_rounded_master(bf);
}

// Under a distributed optimizer the model holds no master: write_params sets the copy
// alone, staged through the gradient arena, which it leaves zeroed; the loss is that of
// the model that keeps its master.
TEST(MixedPrecision, AModelWithoutItsMasterHoldsTheRoundedCopy) {
  Trainee keeps(test_support::make_bf16_cpu_ops());
  auto ops = test_support::make_bf16_cpu_ops();
  GptModel lean(small_model(), 2, *ops, whole_model(small_model()), nullptr, {},
                GptModel::Master::InOptimizer);
  EXPECT_EQ(lean.params(), nullptr);
  const size_t n = lean.layout().total_floats();
  std::vector<float> master(n), copy(n), grads(n, 1.0f);
  keeps.model.read_params(master.data());
  lean.write_params(master.data());
  ops->to_float(copy.data(), lean.weights(), n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(copy[i], test_support::from_bf16(test_support::to_bf16(master[i]))) << i;
  ops->download(grads.data(), lean.grads(), n * sizeof(float));
  EXPECT_EQ(grads, std::vector<float>(n, 0.0f));
  const ModelConfig m = small_model();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 13), tg = tokens(2 * m.seq_len, m.vocab_size, 14);
  EXPECT_EQ(lean.forward(in.data(), tg.data()), keeps.model.forward(in.data(), tg.data()));
  EXPECT_THROW(lean.read_params(master.data()), std::exception);
  auto fp32 = ops::make_cpu_ops(1);
  EXPECT_THROW(GptModel(m, 2, *fp32, whole_model(m), nullptr, {}, GptModel::Master::InOptimizer),
               std::exception);
}

TEST(MixedPrecision, LossAndGradientsMatchFp32UpToBf16Rounding) {
  Trainee bf(test_support::make_bf16_cpu_ops()), fp(ops::make_cpu_ops(1));
  const ModelConfig m = small_model();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 11), tg = tokens(2 * m.seq_len, m.vocab_size, 12);
  std::vector<float> g_bf, g_fp;
  const float l_bf = bf.loss_and_grads(in, tg, &g_bf), l_fp = fp.loss_and_grads(in, tg, &g_fp);
  EXPECT_NEAR(l_bf, l_fp, 1e-2 * l_fp);
  ASSERT_TRUE(std::isfinite(dot(g_bf, g_bf)));
  const double cosine = dot(g_bf, g_fp) / std::sqrt(dot(g_bf, g_bf) * dot(g_fp, g_fp));
  EXPECT_GT(cosine, 0.999);
  EXPECT_NEAR(std::sqrt(dot(g_bf, g_bf)), std::sqrt(dot(g_fp, g_fp)), 2e-2 * std::sqrt(dot(g_fp, g_fp)));
}

TEST(MixedPrecision, TrainsLikeFp32AndKeepsTheCopyInStep) {
  Trainee bf(test_support::make_bf16_cpu_ops()), fp(ops::make_cpu_ops(1));
  const ModelConfig m = small_model();
  TrainConfig t;
  t.weight_decay = 0.1;
  AdamW opt_bf(*bf.ops, bf.model.layout(), t), opt_fp(*fp.ops, fp.model.layout(), t);
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 21), tg = tokens(2 * m.seq_len, m.vocab_size, 22);
  std::vector<float> g;
  float first = 0, last_bf = 0, last_fp = 0;
  for (int step = 1; step <= 30; ++step) {
    last_bf = bf.loss_and_grads(in, tg, &g);
    last_fp = fp.loss_and_grads(in, tg, &g);
    if (step == 1) first = last_fp;
    opt_bf.step(bf.model.params(), bf.model.weights(), bf.model.grads(), 3e-3f, 1.0f, step);
    opt_fp.step(fp.model.params(), nullptr, fp.model.grads(), 3e-3f, 1.0f, step);
  }
  EXPECT_LT(last_fp, 0.5f * first);  // it memorises the batch
  EXPECT_NEAR(last_bf, last_fp, 0.05 * first);
  expect_copy_is_rounded_master(bf);
}

}  // namespace
}  // namespace pptrain
