// `pptrain plan`: every layout of a config's model and global batch that a cluster can
// run, its predicted peak memory and step time, ranked by predicted tokens/s.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "plan/cluster.hpp"

namespace pptrain {

struct PlanRow {
  // The layout.
  int tp = 1, cp = 1, pp = 1, dp = 1, virtual_stages = 1, micro_batch_size = 1, micro_batches = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  int zero = 0;
  // The prediction.
  bool fits = false;
  double peak_memory_mib = 0, step_time_s = 0, tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0,
         bubble = 0;
  std::string dropped;  // why a layout breaks a constraint ("" when it does not)
};

struct PlanOptions {
  bool this_layout = false;      // only the config's own layout
  bool all = false;              // also rows that do not fit, and dropped layouts
  bool tp_across_nodes = false;  // let tp groups span nodes
  int top = 0;                   // > 0 (without `all`): only the best `top` rows are wanted
  // When set, only the layouts it accepts are searched (parallel.layout: auto keeps the
  // keys a config gives).
  std::function<bool(const PlanRow&)> accept;
};

// Sets the row's layout in `config`: tp, pp, dp, virtual stages, micro-batch size and
// count, schedule, sequence parallelism, ZeRO and train.recompute.
void apply_layout(Config& config, const PlanRow& row);

// Rows ranked: layouts that fit by predicted tokens/s, then (with `all`) those that do
// not, then the dropped ones with their reason. With `top`, the first `top` rows are
// those of the full search, found without predicting layouts that cannot be among them.
std::vector<PlanRow> plan_layouts(const Config& config, const Cluster& cluster,
                                  const PlanOptions& options);

// The rows as a table (one line each) or as a JSON list of objects with the same keys.
std::string format_plan(const std::vector<PlanRow>& rows, int top);
std::string format_plan_json(const std::vector<PlanRow>& rows, int top);

}  // namespace pptrain
