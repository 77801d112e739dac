// The planner's time model: one optimizer step of a config's layout on a cluster,
// predicted from roofline costs of every operation, the collectives on the links their
// ranks sit on, and the pipeline simulator running each rank's own schedule with those
// costs. The equations are in docs/design.md ("The planner's time model").
#pragma once
#include <vector>

#include "config/config.hpp"
#include "pipeline/schedule.hpp"
#include "plan/cluster.hpp"

namespace pptrain {

struct StepPrediction {
  double step_time_s = 0;  // one optimizer step
  double pipeline_s = 0;   // the simulated schedule (compute, tp collectives, messages)
  double bubble = 0;       // the simulated schedule's
  double dp_exposed_s = 0;  // data-parallel and tied-embedding reduction not overlapped
  double optimizer_s = 0;   // grad norm and AdamW
  StageCosts first_stage{0, 0, 0, 0};   // F, B, W seconds of one micro-batch on stage 0's chunks
};

// `config`'s layout (parallel.*, train.recompute, sequence parallelism) on `cluster`,
// whose world size must be the layout's.
StepPrediction predict_step(const Config& config, const Cluster& cluster);
// The same with every stage's steps already built (build_all_steps for the config's
// schedule in the cluster's message mode), as the planner shares them.
StepPrediction predict_step(const Config& config, const Cluster& cluster,
                            const std::vector<std::vector<Step>>& steps);
// A bound predict_step's step time is never below, without running the schedule: the
// busiest stage's F, B and W for every micro-batch, then what follows the schedule.
double step_time_lower_bound(const Config& config, const Cluster& cluster);

// The layers of each of the pp * virtual_stages virtual stages that make the slowest one's
// F + B + W (one micro-batch) as small as it can be, counting the embedding on the first
// and the LM head and loss on the last; every stage keeps a layer.
std::vector<int> balance_layers(const Config& config, const Cluster& cluster);
// parallel.layers_per_stage: auto -> the balanced split for the device the run uses (the
// cpu preset on the CPU, h100-sxm on CUDA), kept marked auto; a no-op otherwise.
void resolve_layer_split(Config& config);

// Seconds of one GEMM (M x K) @ (K x N) on the device: its FLOPs at the efficiency its
// smallest dimension reaches, or its bytes at memory bandwidth, whichever is longer,
// plus one launch.
double gemm_seconds(const DeviceSpec& d, double M, double N, double K, double elem_bytes);
// Seconds of a ring collective moving `bytes` per rank over `ranks` ranks on `link`:
// all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n of the bytes, and a latency
// per ring step.
double all_reduce_seconds(const LinkSpec& link, double bytes, int ranks);
double gather_seconds(const LinkSpec& link, double bytes, int ranks);

}  // namespace pptrain
