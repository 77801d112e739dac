// The whole GPT on the CUDA backend against the CPU: the loss, every gradient and a few
// AdamW steps, in fp32 (against the fp32 CPU reference) and in bf16 (against the CPU
// test backend that stores the same arrays in bf16). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "bf16_cpu_ops.hpp"
#include "core/random.hpp"
#include "model/gpt.hpp"
#include "model_test_util.hpp"
#include "optim/adamw.hpp"

namespace pptrain {
namespace {

ModelConfig model_config() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 64;
  m.seq_len = 64;
  m.vocab_size = 101;  // padded to 128: the masked columns are exercised
  return m;
}

using test_support::tokens;

struct Replica {
  Replica(std::unique_ptr<ops::Ops> backend, const TrainConfig& t, const ActivationPolicy& policy = {})
      : ops(std::move(backend)),
        model(model_config(), 2, *ops, whole_model(model_config()), nullptr, policy),
        opt(*ops, model.layout(), t) {
    model.init_parameters(5);
  }
  float step(const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int t) {
    model.zero_grads();
    const float loss = model.forward(in.data(), tg.data(), 1.0f);
    model.backward_input();
    model.backward_weight();
    grads.resize(model.layout().total_floats());
    ops->download(grads.data(), model.grads(), grads.size() * sizeof(float));
    opt.step(model.params(), model.has_weight_copy() ? model.weights() : nullptr, model.grads(),
             1e-3f, 1.0f, t);
    return loss;
  }
  std::unique_ptr<ops::Ops> ops;
  GptModel model;
  AdamW opt;
  std::vector<float> grads;  // host copy of the last step's gradients
};

// max |a - b| over max |b|; NaN anywhere gives NaN (which fails every bound).
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return NAN;
    diff = std::max(diff, d);
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

class CudaModelTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaModelTest, LossGradientsAndUpdatesMatchTheCpu) {
  const bool bf16 = GetParam() == DType::BF16;
  TrainConfig t;
  t.weight_decay = 0.1;
  Replica gpu(ops::make_cuda_ops(0, GetParam()), t);
  Replica cpu(bf16 ? test_support::make_bf16_cpu_ops() : ops::make_cpu_ops(1), t);
  const ModelConfig m = model_config();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 1), tg = tokens(2 * m.seq_len, m.vocab_size, 2);
  // Both run the same arithmetic; bf16 differs by where the roundings fall.
  const double loss_tol = bf16 ? 1e-2 : 2e-5, grad_tol = bf16 ? 5e-2 : 1e-4;
  for (int step = 1; step <= 3; ++step) {
    const float lg = gpu.step(in, tg, step), lc = cpu.step(in, tg, step);
    ASSERT_TRUE(std::isfinite(lg)) << "step " << step;
    EXPECT_NEAR(lg, lc, loss_tol * lc) << "step " << step;
    EXPECT_LE(relative_error(gpu.grads, cpu.grads), grad_tol) << "step " << step;
  }
  std::vector<float> pg(gpu.model.layout().total_floats()), pc(pg.size());
  gpu.model.read_params(pg.data());
  cpu.model.read_params(pc.data());
  EXPECT_LE(relative_error(pg, pc), bf16 ? 1e-2 : 1e-5);
}

TEST_P(CudaModelTest, EvaluationLossesArePerPositionAndMatch) {
  TrainConfig t;
  Replica gpu(ops::make_cuda_ops(0, GetParam()), t);
  Replica cpu(GetParam() == DType::BF16 ? test_support::make_bf16_cpu_ops() : ops::make_cpu_ops(1), t);
  const ModelConfig m = model_config();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 3), tg = tokens(2 * m.seq_len, m.vocab_size, 4);
  gpu.model.forward(in.data(), tg.data(), 0.0f);
  cpu.model.forward(in.data(), tg.data(), 0.0f);
  EXPECT_LE(relative_error(gpu.model.position_losses(), cpu.model.position_losses()),
            GetParam() == DType::BF16 ? 2e-2 : 1e-5);
}

// Recomputation on the CUDA backend: the same kernels on the same inputs, so the losses
// and gradients of recompute: none, bit for bit (W right after B, and W deferred).
TEST_P(CudaModelTest, RecomputationChangesNoBit) {
  const ModelConfig m = model_config();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 5), tg = tokens(2 * m.seq_len, m.vocab_size, 6);
  for (bool fused_attention : {false, true}) {
    if (fused_attention && GetParam() != DType::BF16) continue;  // the fused kernels are bf16
    for (bool follows : {true, false}) {
      auto run = [&](Recompute mode) {
        ActivationPolicy policy;
        policy.recompute = mode;
        policy.weight_follows_input = follows;
        Replica r(ops::make_cuda_ops(0, GetParam(), fused_attention), TrainConfig{}, policy);
        r.grads.push_back(r.step(in, tg, 1));
        return r.grads;
      };
      const std::vector<float> none = run(Recompute::None);
      for (Recompute mode : {Recompute::Selective, Recompute::Full})
        EXPECT_TRUE(run(mode) == none) << name_of(mode) << (fused_attention ? ", fused" : "")
                                       << (follows ? "" : ", W deferred");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaModelTest, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace pptrain
