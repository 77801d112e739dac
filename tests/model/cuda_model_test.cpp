// The whole GPT on the CUDA backend against the CPU: the loss, every gradient and a few
// AdamW steps, in fp32 (against the fp32 CPU reference) and in bf16 (against the CPU
// test backend that stores the same arrays in bf16). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bf16_cpu_ops.hpp"
#include "checked_step.hpp"
#include "core/random.hpp"
#include "model/gpt.hpp"
#include "model_test_util.hpp"
#include "optim/adamw.hpp"

namespace pptrain {
namespace {

using test_support::CheckedReplica;
using test_support::tokens;

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

// Each step starts both backends from the same parameters (the CPU's), so the losses
// and gradients compare the two backends' arithmetic at one point. Parameters after
// AdamW are not compared across backends: m / sqrt(v) is about sign(g), so a gradient
// near zero that rounds to the other sign moves its parameter by up to 2 lr, whatever
// the code. Instead each backend's update is checked against the same update in double
// from its own state and gradients, within a bound of fp32 rounding (adamw_check.hpp).
TEST_P(CudaModelTest, LossGradientsAndUpdatesMatchTheCpu) {
  const bool bf16 = GetParam() == DType::BF16;
  TrainConfig t;
  t.weight_decay = 0.1;
  CheckedReplica gpu(ops::make_cuda_ops(0, GetParam()), t);
  CheckedReplica cpu(bf16 ? test_support::make_bf16_cpu_ops() : ops::make_cpu_ops(1), t);
  const ModelConfig m = test_support::comparison_model();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 1),
             tg = tokens(2 * m.seq_len, m.vocab_size, 2);
  const double loss_tol = bf16 ? 1e-2 : 2e-5;
  const double grad_bound =
      bf16 ? test_support::kBf16GradientBound : test_support::kFp32GradientBound;
  for (int step = 1; step <= 3; ++step) {
    gpu.model.write_params(cpu.params().data());
    const float lg = gpu.step(in, tg, step), lc = cpu.step(in, tg, step);
    ASSERT_TRUE(std::isfinite(lg)) << "step " << step;
    EXPECT_NEAR(lg, lc, loss_tol * lc) << "step " << step;
    double worst = 0;
    EXPECT_TRUE(
        test_support::gradients_close(gpu.model.layout(), gpu.grads, cpu.grads, grad_bound, &worst))
        << "step " << step;
    EXPECT_TRUE(gpu.update) << "CUDA, step " << step;
    EXPECT_TRUE(cpu.update) << "CPU, step " << step;
    std::printf(
        "step %d: loss %.9g vs %.9g, gradients %.3g of the bound, updates %.3g and %.3g of "
        "theirs\n",
        step, lg, lc, worst / grad_bound, gpu.update_worst, cpu.update_worst);
  }
}

TEST_P(CudaModelTest, EvaluationLossesArePerPositionAndMatch) {
  TrainConfig t;
  CheckedReplica gpu(ops::make_cuda_ops(0, GetParam()), t);
  CheckedReplica cpu(
      GetParam() == DType::BF16 ? test_support::make_bf16_cpu_ops() : ops::make_cpu_ops(1), t);
  const ModelConfig m = test_support::comparison_model();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 3),
             tg = tokens(2 * m.seq_len, m.vocab_size, 4);
  gpu.model.forward(in.data(), tg.data(), 0.0f);
  cpu.model.forward(in.data(), tg.data(), 0.0f);
  EXPECT_LE(relative_error(gpu.model.position_losses(), cpu.model.position_losses()),
            GetParam() == DType::BF16 ? 2e-2 : 1e-5);
}

// Recomputation on the CUDA backend: the same kernels on the same inputs, so the losses
// and gradients of recompute: none, bit for bit (W right after B, and W deferred).
TEST_P(CudaModelTest, RecomputationChangesNoBit) {
  const ModelConfig m = test_support::comparison_model();
  const auto in = tokens(2 * m.seq_len, m.vocab_size, 5),
             tg = tokens(2 * m.seq_len, m.vocab_size, 6);
  for (bool fused_attention : {false, true}) {
    if (fused_attention && GetParam() != DType::BF16) continue;  // the fused kernels are bf16
    for (bool follows : {true, false}) {
      auto run = [&](Recompute mode) {
        ActivationPolicy policy;
        policy.recompute = mode;
        policy.weight_follows_input = follows;
        CheckedReplica r(ops::make_cuda_ops(0, GetParam(), fused_attention), TrainConfig{}, policy);
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
