// The bounds of the backend comparisons (checked_step.hpp) on the CPU alone, where both
// sides are known: a backend whose every activation output is one ulp up, as another
// summation order may round it, stays within them; a backend that rounds its
// activations to bf16, and a loss with one target of 128 wrong, do not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "bf16_cpu_ops.hpp"
#include "checked_step.hpp"
#include "model_test_util.hpp"

namespace pptrain::test_support {
namespace {

TrainConfig train_config() {
  TrainConfig t;
  t.weight_decay = 0.1;
  return t;
}

std::vector<int32_t> sequence(uint64_t key) {
  const ModelConfig m = comparison_model();
  return tokens(CheckedReplica::kBatch * m.seq_len, m.vocab_size, key);
}

TEST(BackendComparison, OneUlpUpInEveryOutputStaysWithinTheBounds) {
  CheckedReplica ref(ops::make_cpu_ops(1), train_config());
  CheckedReplica nudged(make_one_ulp_up_cpu_ops(), train_config());
  const auto in = sequence(1), tg = sequence(2);
  for (int step = 1; step <= 3; ++step) {
    nudged.model.write_params(ref.params().data());
    const float ln = nudged.step(in, tg, step), lr = ref.step(in, tg, step);
    EXPECT_NEAR(ln, lr, 2e-5 * lr) << "step " << step;
    double worst = 0;
    EXPECT_TRUE(
        gradients_close(ref.model.layout(), nudged.grads, ref.grads, kFp32GradientBound, &worst))
        << "step " << step;
    EXPECT_TRUE(nudged.update) << "step " << step;
    std::printf("step %d: gradients %.3g of the fp32 bound\n", step, worst / kFp32GradientBound);
  }
}

TEST(BackendComparison, ActivationsInBf16FailTheFp32Bound) {
  CheckedReplica ref(ops::make_cpu_ops(1), train_config());
  CheckedReplica bf16(make_bf16_cpu_ops(), train_config());
  bf16.model.write_params(ref.params().data());
  const auto in = sequence(1), tg = sequence(2);
  bf16.step(in, tg, 1);
  ref.step(in, tg, 1);
  EXPECT_FALSE(gradients_close(ref.model.layout(), bf16.grads, ref.grads, kFp32GradientBound));
  // ...and the bf16 bound is the one it meets.
  EXPECT_TRUE(gradients_close(ref.model.layout(), bf16.grads, ref.grads, kBf16GradientBound));
}

TEST(BackendComparison, OneWrongTargetOf128FailsTheFp32Bound) {
  CheckedReplica ref(ops::make_cpu_ops(1), train_config());
  CheckedReplica wrong(ops::make_cpu_ops(1), train_config());
  const auto in = sequence(1), tg = sequence(2);
  auto tg_wrong = tg;
  tg_wrong.back() = (tg_wrong.back() + 1) % comparison_model().vocab_size;
  wrong.step(in, tg_wrong, 1);
  ref.step(in, tg, 1);
  EXPECT_FALSE(gradients_close(ref.model.layout(), wrong.grads, ref.grads, kFp32GradientBound));
}

}  // namespace
}  // namespace pptrain::test_support
