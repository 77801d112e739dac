// The changes suggested to a run that does not fit: each fits, keeps the model and the
// global batch, and they come fastest first.
#include <gtest/gtest.h>

#include "plan/memory_fixes.hpp"
#include "train/memory_check.hpp"
#include "train/memory_plan.hpp"

namespace pptrain {
namespace {

// Activations dominate: long sequences, several per micro-batch, two data-parallel
// ranks (ZeRO-1 is a candidate).
Config activation_heavy() {
  return parse_config(
      "model: {n_layer: 4, n_head: 4, d_model: 128, seq_len: 1024, vocab_size: 512}\n"
      "parallel: {dp: 2, micro_batches: 2, micro_batch_size: 8}\n",
      "m.yaml");
}

TEST(MemoryFixes, EachFitsAndTheyComeFastestFirst) {
  const Config c = activation_heavy();
  const double peak = predict_peak_memory(c, backend_traits(c, false)).total();
  const double available = 0.6 * peak;
  const auto fixes = memory_fixes(c, false, available);
  ASSERT_FALSE(fixes.empty());
  EXPECT_LE(fixes.size(), 3u);
  for (std::size_t i = 0; i < fixes.size(); ++i) {
    EXPECT_LE(fixes[i].peak_bytes, available);
    EXPECT_FALSE(fixes[i].sets.empty());
    if (i > 0) EXPECT_LE(fixes[i - 1].step_time_s, fixes[i].step_time_s);
  }
  // What the fix says is what was predicted: applied, it gives the same peak.
  const Config fixed = parse_config(to_yaml(c), "m.yaml", fixes[0].sets);
  EXPECT_EQ(tokens_per_step(fixed), tokens_per_step(c));
  EXPECT_EQ(predict_peak_memory(fixed, backend_traits(fixed, false)).total(), fixes[0].peak_bytes);
  const std::string text = describe_fixes(fixes);
  EXPECT_EQ(text.rfind("; it fits with --set ", 0), 0u) << text;
}

TEST(MemoryFixes, NoneWhenNothingFits) {
  const Config c = activation_heavy();
  EXPECT_TRUE(memory_fixes(c, false, 1.0).empty());
  EXPECT_EQ(describe_fixes({}), "");
}

TEST(MemoryCheck, TheHostSaysWhatItHas) {
  const auto available = host_memory_available();
  ASSERT_TRUE(available.has_value());  // Linux: /proc/meminfo
  EXPECT_GT(*available, 0.0);
}

}  // namespace
}  // namespace pptrain
