// The memory plan's state per parameter: weights, gradients, weight copy and optimizer
// state over the heaviest rank's parameters, as ZeRO-1 shards them.
#include <gtest/gtest.h>

#include "ops/ops.hpp"
#include "train/memory_check.hpp"
#include "train/memory_plan.hpp"

namespace pptrain {
namespace {

double state_bytes(int dp, int zero, bool cuda) {
  const Config c = parse_config(
      "model: {n_layer: 4, n_head: 4, d_model: 256, seq_len: 64, vocab_size: 512}\n"
      "parallel: {dp: " + std::to_string(dp) + ", zero: " + std::to_string(zero) + "}\n" +
          (cuda ? "device: cuda\n" : ""),
      "m.yaml");
  return predict_peak_memory(c, backend_traits(c, cuda)).state_bytes_per_parameter();
}

// fp32 weights and gradients (4 + 4), the moments (8) over d under ZeRO-1, and on a GPU
// the bf16 weight copy (2), with the fp32 master (4) over d too under ZeRO-1; the arena's
// alignment gaps add well under 1%.
TEST(MemoryPlan, StateBytesPerParameter) {
  EXPECT_NEAR(state_bytes(1, 0, false), 16.0, 0.1);
  EXPECT_NEAR(state_bytes(2, 1, false), 8.0 + 8.0 / 2, 0.1);
  EXPECT_NEAR(state_bytes(4, 1, false), 8.0 + 8.0 / 4, 0.1);
  EXPECT_NEAR(state_bytes(1, 0, true), 18.0, 0.1);
  // A GPU's distributed optimizer shards the fp32 master with the moments.
  EXPECT_NEAR(state_bytes(2, 1, true), 6.0 + 12.0 / 2, 0.1);
  EXPECT_NEAR(state_bytes(4, 1, true), 6.0 + 12.0 / 4, 0.1);
}

// An allocation that fails names what it was for, how much was asked and held; the run
// adds the plan's prediction.
TEST(MemoryPlan, AFailedAllocationSaysWhatItWasFor) {
  const auto cpu = ops::make_cpu_ops(1);
  const std::size_t huge = std::size_t(1) << 50;  // 1 PiB: beyond any address space
  for (bool zeroed : {false, true}) {
    try {
      ops::Buffer b = zeroed ? ops::Buffer::zeroed(*cpu, huge, "the gradient arena")
                             : ops::Buffer(*cpu, huge, "the gradient arena");
      FAIL() << "1 PiB was allocated";
    } catch (const ops::OutOfMemory& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.bytes, huge);
      EXPECT_NE(what.find("out of memory on cpu"), std::string::npos) << what;
      EXPECT_NE(what.find("the gradient arena of 1073741824.0 MiB"), std::string::npos) << what;
    }
  }
  const Config c = parse_config("model: {n_layer: 2, d_model: 64}\n", "m.yaml");
  EXPECT_EQ(predicted_peak_note(c).rfind("; the memory plan predicts ", 0), 0u);
}

}  // namespace
}  // namespace pptrain
