// parallel.layout: auto: the planner's fastest layout that fits, keeping the keys the
// config gives, on a machine read the same way by every rank.
#include <gtest/gtest.h>

#include "plan/auto_layout.hpp"
#include "train/memory_check.hpp"
#include "train/memory_plan.hpp"

namespace pptrain {
namespace {

// 8 layers, a global batch of 32 sequences; no layout key given.
Config model(const std::vector<std::string>& sets = {}) {
  return parse_config(
      "model: {n_layer: 8, n_head: 8, d_model: 256, seq_len: 512, vocab_size: 1024}\n"
      "parallel: {layout: auto, micro_batches: 8, micro_batch_size: 4}\n",
      "auto.yaml", sets);
}

Cluster gpus(int count, double memory_gib) {
  Cluster c;
  c.gpus_per_node = count;
  c.device = device_preset("h100-sxm");
  c.device.memory_gib = memory_gib;
  c.intra_node = preset_intra_node("h100-sxm");
  c.inter_node = preset_inter_node("h100-sxm");
  c.source = describe_machine(c);
  return c;
}

TEST(AutoLayout, TakesThePlannersFastestLayoutThatFits) {
  const Config c = model();
  const Cluster machine = gpus(8, 80);
  const AutoLayout a = choose_layout(c, machine);
  PlanOptions top;
  top.top = 1;
  const std::vector<PlanRow> rows = plan_layouts(c, machine, top);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(a.row.tokens_per_s, rows[0].tokens_per_s);
  const ParallelConfig& p = a.config.parallel;
  EXPECT_EQ(p.layout, LayoutChoice::Manual);
  EXPECT_EQ(world_size(a.config), 8);
  EXPECT_EQ(tokens_per_step(a.config), tokens_per_step(c));  // the global batch is kept
  EXPECT_EQ(p.tp, rows[0].tp);
  EXPECT_EQ(p.pp, rows[0].pp);
  EXPECT_EQ(p.micro_batch_size, rows[0].micro_batch_size);
  EXPECT_EQ(a.config.train.recompute, rows[0].recompute);
  // The --set lines reproduce it from the written config.
  std::vector<std::string> sets = a.sets;
  sets.push_back("parallel.layout=manual");
  const Config again = model(sets);
  EXPECT_EQ(to_yaml(again), to_yaml(a.config));
}

TEST(AutoLayout, KeepsTheKeysTheConfigGives) {
  const Config c = model({"parallel.tp=2", "parallel.schedule=interleaved", "train.recompute=selective"});
  const AutoLayout a = choose_layout(c, gpus(8, 80));
  EXPECT_EQ(a.config.parallel.tp, 2);
  EXPECT_EQ(a.config.parallel.schedule, ScheduleKind::Interleaved);
  EXPECT_GT(a.config.parallel.pp, 1);  // interleaving needs a pipeline
  EXPECT_EQ(a.config.train.recompute, Recompute::Selective);
  EXPECT_EQ(world_size(a.config), 8);
  // A layers_per_stage list fixes the number of stages.
  const Config split = model({"parallel.layers_per_stage=[2,2,2,2]", "parallel.schedule=1f1b"});
  const AutoLayout b = choose_layout(split, gpus(8, 80));
  EXPECT_EQ(b.config.parallel.pp * b.config.parallel.virtual_stages, 4);
}

TEST(AutoLayout, FitsWhatTheMachineHolds) {
  const Config c = model();
  const Cluster roomy = gpus(4, 80);
  const AutoLayout a = choose_layout(c, roomy);
  // The smallest memory some layout fits: the choice changes to one that fits it.
  PlanOptions every;
  every.all = true;
  double least = 1e300;
  for (const PlanRow& r : plan_layouts(c, roomy, every))
    if (r.dropped.empty()) least = std::min(least, r.peak_memory_mib);
  ASSERT_LT(least, a.row.peak_memory_mib);
  const Cluster tight = gpus(4, least / 1024 + roomy.device.reserved_gib);
  const AutoLayout b = choose_layout(c, tight);
  EXPECT_LE(b.row.peak_memory_mib, least * (1 + 1e-12));
  EXPECT_LE(predict_peak_memory(b.config, backend_traits(b.config, true)).total(),
            (tight.device.memory_gib - tight.device.reserved_gib) * double(1 << 30));
}

TEST(AutoLayout, NoneFitsNamesTheLeastMemoryOneNeeds) {
  const Config c = model();
  try {
    (void)choose_layout(c, gpus(2, 2.01));
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("auto.yaml: parallel.layout: auto: no layout fits 2 x h100-sxm"), std::string::npos)
        << what;
    EXPECT_NE(what.find("the least any needs is"), std::string::npos) << what;
    EXPECT_NE(what.find("--set parallel.layout=manual --set parallel.tp="), std::string::npos) << what;
  }
}

TEST(AutoLayout, OneCpuRankUnlessLaunchedWithMore) {
  Config c = model({"device=cpu"});
  const Cluster one = local_machine(c, 0, 0);
  EXPECT_EQ(one.world(), 1);
  EXPECT_TRUE(one.device.cpu);
  const auto host = host_memory_total();
  ASSERT_TRUE(host.has_value());
  EXPECT_DOUBLE_EQ(one.device.memory_gib * double(1 << 30), *host);
  const Cluster four = local_machine(c, 4, 2);
  EXPECT_EQ(four.world(), 4);
  EXPECT_EQ(four.nodes, 2);
  EXPECT_DOUBLE_EQ(four.device.memory_gib * double(1 << 30), *host / 2);
  EXPECT_DOUBLE_EQ(four.device.reserved_gib, four.device.memory_gib / 10);
}

// At 16K positions on ranks whose memory holds a cp 2 rank but no layout without cp,
// auto splits the sequences, and the --set lines carry cp; a cp the config gives is kept
// (cp 1 here: then nothing fits). On CPU ranks, and on GPUs (bf16, where the ring runs
// the fused kernels).
TEST(AutoLayout, ChoosesContextParallelismWhereNothingElseFits) {
  for (const char* device : {"cpu", "cuda"}) {
    SCOPED_TRACE(device);
    const std::string yaml =
        "model: {n_layer: 2, n_head: 4, d_model: 64, seq_len: 16384, vocab_size: 256}\n"
        "parallel: {layout: auto, micro_batches: 4, micro_batch_size: 1}\ndevice: " +
        std::string(device) + "\n";
    const Config c = parse_config(yaml, "long.yaml");
    Cluster four = gpus(4, 80);
    if (device == std::string("cpu")) {
      four.device = device_preset("cpu");
      four.intra_node = preset_intra_node("cpu");
      four.inter_node = preset_inter_node("cpu");
    }
    PlanOptions all;
    all.all = true;
    double least_without = 1e300, least_with = 1e300;
    for (const PlanRow& r : plan_layouts(c, four, all)) {
      if (!r.dropped.empty()) continue;
      (r.cp == 1 ? least_without : least_with) = std::min(r.cp == 1 ? least_without : least_with,
                                                          r.peak_memory_mib);
    }
    ASSERT_LT(least_with, least_without);
    // Room for the least a cp layout needs, not for any layout without cp.
    four.device.memory_gib = (least_with + least_without) / 2 / 1024 + four.device.reserved_gib;
    four.source = describe_machine(four);
    const AutoLayout a = choose_layout(c, four);
    EXPECT_GT(a.config.parallel.cp, 1);
    EXPECT_EQ(world_size(a.config), 4);
    EXPECT_EQ(tokens_per_step(a.config), tokens_per_step(c));
    std::vector<std::string> sets = a.sets;
    sets.push_back("parallel.layout=manual");
    EXPECT_EQ(to_yaml(parse_config(yaml, "long.yaml", sets)), to_yaml(a.config));
    EXPECT_THROW(choose_layout(parse_config(yaml, "long.yaml", {"parallel.cp=1"}), four),
                 InputError);
    // A cp > 1 given with auto is refused: give the whole layout.
    EXPECT_THROW(parse_config(yaml, "long.yaml", {"parallel.cp=2"}), InputError);
  }
}

TEST(AutoLayout, TheConfigKnowsWhichKeysItGives) {
  const Config c = model({"parallel.dp=2"});
  EXPECT_EQ(c.given_keys.count("parallel.micro_batches"), 1u);
  EXPECT_EQ(c.given_keys.count("parallel.dp"), 1u);
  EXPECT_EQ(c.given_keys.count("parallel.tp"), 0u);
  EXPECT_EQ(c.given_keys.count("train.recompute"), 0u);
}

}  // namespace
}  // namespace pptrain
