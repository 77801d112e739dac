// The planner: cluster files, the time model's parts against their formulas, and the
// search's invariants (same model and global batch, constraints, ranking).
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <set>
#include <tuple>

#include "core/error.hpp"
#include "model/gpt.hpp"
#include "plan/kernel_traffic.hpp"
#include "plan/planner.hpp"
#include "plan/time_model.hpp"

namespace pptrain {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_cluster(yaml, "c.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ClusterFile, PresetsAndOverrides) {
  const Cluster c = parse_cluster("nodes: 2\ngpus_per_node: 8\ndevice: h100-sxm\n", "c.yaml");
  EXPECT_EQ(c.world(), 16);
  EXPECT_EQ(c.device.peak_tflops, 989);
  EXPECT_EQ(c.intra_node.gbps, 450);
  EXPECT_EQ(c.inter_node.gbps, 50);
  const Cluster o = parse_cluster(
      "gpus_per_node: 4\ndevice: {preset: a100-80gb, memory_gib: 70}\ninter_node_gbps: 12.5\n"
      "latency_us: {inter_node: 20}\n", "o.yaml");
  EXPECT_EQ(o.device.memory_gib, 70);
  EXPECT_EQ(o.device.peak_tflops, 312);
  EXPECT_EQ(o.inter_node.gbps, 12.5);
  EXPECT_EQ(o.inter_node.latency_us, 20);
  const Cluster m = parse_cluster("device: {memory_gib: 24, peak_tflops: 165, hbm_gbps: 1008}\n", "m.yaml");
  EXPECT_EQ(m.device.name, "custom");
  EXPECT_EQ(m.device.hbm_gbps, 1008);
  for (const std::string& name : device_preset_names())
    EXPECT_NO_THROW(parse_cluster("device: " + name + "\n", "p.yaml")) << name;
}

TEST(ClusterFile, BadInputNamesTheKey) {
  EXPECT_NE(error_of("device: tpu-v5\n").find("c.yaml: device: unknown preset 'tpu-v5' (known: a100-40gb"),
            std::string::npos);
  EXPECT_NE(error_of("device: h200\ngpu_per_node: 8\n").find("c.yaml: gpu_per_node: unknown key"),
            std::string::npos);
  EXPECT_NE(error_of("device: h200\nnodes: -1\n").find("c.yaml: nodes: must be > 0"), std::string::npos);
  EXPECT_NE(error_of("device: {memory_gib: 24}\n").find("device.peak_tflops: required without a preset"),
            std::string::npos);
  EXPECT_NE(error_of("gpus_per_node: 8\n").find("device: required"), std::string::npos);
  EXPECT_NE(error_of("device: {preset: h200, gemm_efficiency: 1.5}\n").find("at most 1"), std::string::npos);
}

TEST(TimeModel, RooflineAndRingFormulas) {
  DeviceSpec d = device_preset("h100-sxm");
  d.launch_us = 0;
  // A large GEMM runs at gemm_efficiency * n / (n + half) of peak.
  const double n = 8192, eff = d.gemm_efficiency * n / (n + d.gemm_half_dim);
  EXPECT_NEAR(gemm_seconds(d, n, n, n, 2), 2 * n * n * n / (989e12 * eff), 1e-12);
  // A thin one is bound by memory.
  const double bytes = (4096.0 * 1 + 1 * 4096 + 4096.0 * 4096) * 2;
  EXPECT_NEAR(gemm_seconds(d, 4096, 4096, 1, 2), bytes / (3350e9 * d.memory_efficiency), 1e-12);
  const LinkSpec link{100, 0};
  EXPECT_DOUBLE_EQ(all_reduce_seconds(link, 1e9, 4), 2 * 0.75 * 1e9 / 100e9);
  EXPECT_DOUBLE_EQ(gather_seconds(link, 1e9, 4), 0.75 * 1e9 / 100e9);
  EXPECT_EQ(all_reduce_seconds(link, 1e9, 1), 0);
}

Config small_model() {
  Config c;
  c.model = {8, 8, 512, 256, 8192};
  c.parallel.micro_batches = 8;
  c.parallel.micro_batch_size = 2;
  c.source_path = "model.yaml";
  return c;
}

Cluster gpus(int nodes, int per_node) {
  return parse_cluster("nodes: " + std::to_string(nodes) + "\ngpus_per_node: " +
                       std::to_string(per_node) + "\ndevice: h100-sxm\n", "c.yaml");
}

// One stage: the schedule is m times F + B + W back to back, no bubble.
TEST(TimeModel, OneStageIsTheSumOfItsPasses) {
  const Config c = small_model();
  const StepPrediction p = predict_step(c, gpus(1, 1));
  const double per_mb = p.first_stage.forward + p.first_stage.backward_input + p.first_stage.backward_weight;
  EXPECT_NEAR(p.pipeline_s, 8 * per_mb, 1e-12);
  EXPECT_EQ(p.bubble, 0);
  EXPECT_EQ(p.dp_exposed_s, 0);
  EXPECT_NEAR(p.step_time_s, p.pipeline_s + p.optimizer_s, 1e-15);
}

TEST(TimeModel, RecomputationAddsForwardWork) {
  Config c = small_model();
  const double none = predict_step(c, gpus(1, 1)).step_time_s;
  c.train.recompute = Recompute::Selective;
  const double selective = predict_step(c, gpus(1, 1)).step_time_s;
  c.train.recompute = Recompute::Full;
  const double full = predict_step(c, gpus(1, 1)).step_time_s;
  EXPECT_LT(none, selective);
  EXPECT_LT(selective, full);
}

// On a GPU the attention core costs its launches' bytes and tensor-core instructions
// (kernel_traffic.hpp, checked against the emulator by KernelTraffic), each pass the
// longer of the two at the efficiency of a head-size product, plus its launches: the
// flash kernels, the unfused ones, and those whose backward recomputes the probabilities
// (fused asked for, a head size the flash kernels do not take).
TEST(TimeModel, GpuAttentionIsWhatItsKernelsMove) {
  const Cluster gpu = gpus(1, 1);
  const DeviceSpec& d = gpu.device;
  const auto seconds = [&](const Traffic& t, double hs) {
    const double eff = d.gemm_efficiency * hs / (hs + d.gemm_half_dim);
    return std::max(t.mma * kMmaFlops / (d.peak_tflops * 1e12 * eff),
                    t.bytes() / (d.hbm_gbps * 1e9 * d.memory_efficiency)) +
           t.launches * d.launch_us * 1e-6;
  };
  const auto stage = [&](int heads, Attention a) {
    Config c = small_model();
    c.model.n_head = heads;
    c.train.attention = a;
    return predict_step(c, gpu).first_stage;
  };
  const double L = 8, B = 2, T = 256;
  for (const int heads : {8, 64}) {  // head sizes 64 and 8
    const double hs = 512.0 / heads;
    const StageCosts fused = stage(heads, Attention::Fused), unfused = stage(heads, Attention::Unfused);
    const Traffic forward = unfused_attention_forward(B, heads, heads, T, hs, 2);
    const Traffic backward = unfused_attention_backward(B, heads, heads, T, hs, 2, false);
    if (heads == 8) {
      const double flash_forward = seconds(flash_attention_forward(B, heads, T, hs, 2), hs);
      const double flash_backward = seconds(flash_attention_backward(B, heads, heads, T, hs, 2), hs);
      EXPECT_NEAR(unfused.forward - fused.forward, L * (seconds(forward, hs) - flash_forward), 1e-12);
      EXPECT_NEAR(unfused.backward_input - fused.backward_input,
                  L * (seconds(backward, hs) - flash_backward), 1e-12);
    } else {  // fused falls back to unfused, recomputing the probabilities in B
      const Traffic again = unfused_attention_backward(B, heads, heads, T, hs, 2, true);
      EXPECT_NEAR(unfused.forward, fused.forward, 1e-15);
      EXPECT_NEAR(fused.backward_input - unfused.backward_input,
                  L * (seconds(again, hs) - seconds(backward, hs)), 1e-12);
    }
    EXPECT_EQ(unfused.backward_weight, fused.backward_weight);
  }
}

// Tensor-parallel overlap: where B and W run together, each half of a layer's
// input-gradient sum hides under that half's weight-gradient GEMMs, and under SP each
// norm output's second gather under that half's input-gradient GEMMs; the forward does
// not move. zb-h1, which runs W apart, hides only ln1's gather, under the MLP's W.
TEST(TimeModel, TensorParallelCollectivesHideUnderTheGemms) {
  Config c = small_model();
  c.parallel.tp = 4;
  c.parallel.sequence_parallel = true;
  const StepPrediction on = predict_step(c, gpus(1, 4));
  c.parallel.overlap = false;
  const StepPrediction off = predict_step(c, gpus(1, 4));
  EXPECT_LT(on.first_stage.backward_input, off.first_stage.backward_input);
  EXPECT_LT(on.first_stage.backward_weight, off.first_stage.backward_weight);
  c.parallel.schedule = ScheduleKind::ZeroBubbleH1;
  const StageCosts apart_off = predict_step(c, gpus(1, 4)).first_stage;
  c.parallel.overlap = true;
  const StageCosts apart_on = predict_step(c, gpus(1, 4)).first_stage;
  // W apart: B's sums have no weight gradients to hide under.
  EXPECT_GT(apart_on.backward_input, on.first_stage.backward_input);
  EXPECT_LT(apart_on.backward_weight, apart_off.backward_weight);
  EXPECT_GT(apart_on.backward_weight, on.first_stage.backward_weight);  // one gather hides, not two
  // Without SP there is nothing to gather: W does not move.
  c.parallel.sequence_parallel = false;
  const double no_sp_on = predict_step(c, gpus(1, 4)).first_stage.backward_weight;
  c.parallel.overlap = false;
  EXPECT_EQ(predict_step(c, gpus(1, 4)).first_stage.backward_weight, no_sp_on);
}

// Under SP the forward's gathers and sums, and B's gathers of the output gradients,
// travel by row blocks beside the GEMMs' other blocks: at a 70B-like layer (d_model 8192,
// T 4096, tp 8 on NVLink) most of them hide. Without SP the forward's all-reduces stay
// whole.
TEST(TimeModel, TensorParallelCollectivesTravelByRowBlocks) {
  Config c = small_model();
  c.model = {2, 64, 8192, 4096, 32000};
  c.parallel.micro_batch_size = 1;
  c.parallel.tp = 8;
  for (bool sp : {true, false}) {
    c.parallel.sequence_parallel = sp;
    c.parallel.overlap = true;
    const StageCosts stage_on = predict_step(c, gpus(1, 8)).first_stage;
    c.parallel.overlap = false;
    const StageCosts stage_off = predict_step(c, gpus(1, 8)).first_stage;
    const double on = stage_on.forward, off = stage_off.forward;
    if (sp) {
      EXPECT_LT(on, 0.95 * off);
      EXPECT_GT(on, 0.5 * off);  // the GEMMs and the attention stay
      EXPECT_LT(stage_on.backward_input, 0.95 * stage_off.backward_input);
    } else {
      EXPECT_EQ(on, off);
    }
  }
}

TEST(TimeModel, DataParallelGroupsAcrossNodesPayTheSlowerLink) {
  Config c = small_model();
  c.parallel.dp = 2;
  c.parallel.micro_batches = 4;
  const double within = predict_step(c, gpus(1, 2)).dp_exposed_s;
  const double across = predict_step(c, gpus(2, 1)).dp_exposed_s;
  EXPECT_GT(within, 0);
  EXPECT_GT(across, within * 5);  // 50 GB/s against 450
}

// The head of a large vocabulary outweighs several layers: the last stage gets fewer.
TEST(TimeModel, BalancedSplitCountsTheHeadAndTheEmbedding) {
  Config c = small_model();
  c.parallel.pp = 2;
  c.parallel.micro_batches = 4;
  const Cluster two = gpus(1, 2);
  const std::vector<int> even_vocab = balance_layers(c, two);
  c.model.vocab_size = 200000;
  const std::vector<int> big_vocab = balance_layers(c, two);
  EXPECT_EQ(even_vocab.size(), 2u);
  EXPECT_EQ(even_vocab[0] + even_vocab[1], 8);
  EXPECT_EQ(big_vocab[0] + big_vocab[1], 8);
  EXPECT_GT(big_vocab[0], big_vocab[1]);
  EXPECT_GE(big_vocab[1], 1);
  // A balanced split is never slower than the even one.
  c.parallel.layers_per_stage = big_vocab;
  const double balanced = predict_step(c, two).pipeline_s;
  c.parallel.layers_per_stage = std::vector<int>{};
  EXPECT_LE(balanced, predict_step(c, two).pipeline_s);
  // parallel.layers_per_stage: auto resolves to such a split, and stays marked auto.
  c.parallel.layers_per_stage.automatic = true;
  resolve_layer_split(c);
  EXPECT_TRUE(c.parallel.layers_per_stage.automatic);
  EXPECT_EQ(c.parallel.layers_per_stage.counts.size(), 2u);
}

Cluster cpus(int ranks) {
  return parse_cluster("nodes: 1\ngpus_per_node: " + std::to_string(ranks) + "\ndevice: cpu\n",
                       "c.yaml");
}

// Context parallelism: at 16K positions the search splits sequences; a
// cp 2 layout does half a cp 1 rank's attention, and its ring hides under it; the
// memory of a rank falls.
TEST(Planner, ContextParallelismForLongSequences) {
  Config c;
  c.model = {2, 4, 64, 16384, 256};
  c.device = Device::Cpu;
  c.parallel.micro_batches = 4;
  c.parallel.micro_batch_size = 1;
  c.source_path = "model.yaml";
  const std::vector<PlanRow> rows = plan_layouts(c, cpus(4), {});
  std::set<int> cps;
  for (const PlanRow& r : rows) {
    EXPECT_EQ(r.tp * r.cp * r.pp * r.dp, 4);
    EXPECT_EQ(r.dp * r.micro_batches * r.micro_batch_size, 4);
    cps.insert(r.cp);
  }
  EXPECT_EQ(cps, (std::set<int>{1, 2, 4}));
  // On GPUs where the ring runs the fused kernels (bf16, attention auto or fused), not
  // where it would run the loop kernels (fp32, or attention unfused).
  auto splits = [&](const Config& config) {
    const std::vector<PlanRow> on_gpus = plan_layouts(config, gpus(1, 4), {});
    return std::any_of(on_gpus.begin(), on_gpus.end(), [](const PlanRow& r) { return r.cp > 1; });
  };
  EXPECT_TRUE(splits(c));
  Config loops = c;
  loops.train.precision = Precision::FP32;
  EXPECT_FALSE(splits(loops));
  loops = c;
  loops.train.attention = Attention::Unfused;
  EXPECT_FALSE(splits(loops));
  PlanOptions only;
  only.this_layout = true;
  c.parallel.micro_batches = 1;
  const PlanRow one = plan_layouts(c, cpus(1), only).at(0);
  c.parallel.cp = 2;
  const PlanRow two = plan_layouts(c, cpus(2), only).at(0);
  EXPECT_NEAR(two.step_time_s / one.step_time_s, 0.5, 0.02);
  EXPECT_LT(two.peak_memory_mib, 0.7 * one.peak_memory_mib);
}

TEST(Planner, EveryRowKeepsTheModelAndTheGlobalBatch) {
  const Config c = small_model();
  const Cluster cluster = gpus(2, 4);
  PlanOptions all;
  all.all = true;
  const std::vector<PlanRow> rows = plan_layouts(c, cluster, all);
  ASSERT_GT(rows.size(), 50u);
  std::set<ScheduleKind> kinds;
  bool fits_seen = false, previous_fits = true;
  double previous = INFINITY;
  for (const PlanRow& r : rows) {
    EXPECT_EQ(r.tp * r.cp * r.pp * r.dp, 8);
    EXPECT_EQ(r.cp, 1);  // seq_len 256: too short to split, and GPUs have no ring yet
    EXPECT_EQ(r.dp * r.micro_batches * r.micro_batch_size, 16);
    EXPECT_LE(r.tp, 4);  // within a node
    if (!r.dropped.empty()) continue;
    kinds.insert(r.schedule);
    if (r.fits && previous_fits) {  // ranked by tokens/s among the rows that fit
      EXPECT_LE(r.tokens_per_s, previous * (1 + 1e-12));
      previous = r.tokens_per_s;
    }
    previous_fits = r.fits;
    fits_seen = fits_seen || r.fits;
    EXPECT_NEAR(r.tflops_per_gpu, flops_per_token(c.model) * r.tokens_per_s / 8 / 1e12, 1e-9);
    EXPECT_GT(r.bubble, -1e-12);
  }
  EXPECT_TRUE(fits_seen);
  EXPECT_EQ(kinds.size(), 5u);
}

TEST(TimeModel, LowerBoundIsBelowThePrediction) {
  Config c = small_model();
  for (auto [tp, pp, dp, kind, v] :
       {std::tuple{1, 2, 4, ScheduleKind::OneFOneB, 1}, {2, 2, 2, ScheduleKind::Interleaved, 2},
        {1, 4, 2, ScheduleKind::ZeroBubbleV, 2}, {4, 2, 1, ScheduleKind::GPipe, 1}}) {
    c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.dp = dp;
    c.parallel.schedule = kind, c.parallel.virtual_stages = v;
    c.parallel.micro_batches = 16 / dp, c.parallel.micro_batch_size = 1;
    const double bound = step_time_lower_bound(c, gpus(2, 4));
    EXPECT_GT(bound, 0);
    EXPECT_LE(bound, predict_step(c, gpus(2, 4)).step_time_s * (1 + 1e-12)) << name_of(kind);
  }
}

TEST(Planner, TopRowsAreTheFullSearchsFirst) {
  const Config c = small_model();
  const Cluster cluster = gpus(2, 4);
  const std::vector<PlanRow> full = plan_layouts(c, cluster, {});
  for (int top : {1, 3, 10}) {
    PlanOptions options;
    options.top = top;
    const std::vector<PlanRow> rows = plan_layouts(c, cluster, options);
    ASSERT_GE(rows.size(), size_t(top));
    for (int i = 0; i < top; ++i) {
      EXPECT_EQ(rows[size_t(i)].step_time_s, full[size_t(i)].step_time_s) << top << " " << i;
      EXPECT_EQ(rows[size_t(i)].schedule, full[size_t(i)].schedule);
      EXPECT_EQ(rows[size_t(i)].tp, full[size_t(i)].tp);
      EXPECT_EQ(rows[size_t(i)].micro_batch_size, full[size_t(i)].micro_batch_size);
    }
    EXPECT_LT(rows.size(), full.size());
  }
}

TEST(Planner, ThisLayoutAndWhatDoesNotFit) {
  Config c = small_model();
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  c.parallel.micro_batches = 4;
  c.parallel.micro_batch_size = 4;
  PlanOptions only;
  only.this_layout = true;
  const auto rows = plan_layouts(c, gpus(1, 4), only);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].tp, 2);
  EXPECT_EQ(rows[0].pp, 2);
  EXPECT_TRUE(rows[0].dropped.empty());
  EXPECT_THROW(plan_layouts(c, gpus(1, 8), only), InputError);  // 4 ranks on 8
  // A device too small for any layout: nothing fits, and --all lists them as such.
  Cluster tiny = parse_cluster("gpus_per_node: 4\ndevice: {preset: h100-sxm, memory_gib: 0.05, "
                               "reserved_gib: 0}\n", "t.yaml");
  EXPECT_TRUE(plan_layouts(c, tiny, {}).empty());
  PlanOptions all;
  all.all = true;
  for (const PlanRow& r : plan_layouts(c, tiny, all)) EXPECT_FALSE(r.fits);
  const std::string json = format_plan_json(plan_layouts(c, gpus(1, 4), {}), 3);
  for (const char* key : {"\"tp\"", "\"schedule\"", "\"fits\"", "\"peak_memory_mib\"", "\"step_time_s\"",
                          "\"tokens_per_s\"", "\"tflops_per_gpu\"", "\"mfu\"", "\"bubble\""})
    EXPECT_NE(json.find(key), std::string::npos) << key;
}

}  // namespace
}  // namespace pptrain
