// parallel.layout: auto. At start, the planner (planner.hpp) ranks every layout of the
// config's model and global batch on the machine the run starts on, and the run takes
// the fastest that fits. Keys the config gives are kept.
#pragma once
#include <string>
#include <vector>

#include "config/config.hpp"
#include "plan/cluster.hpp"
#include "plan/planner.hpp"

namespace pptrain {

// The machine a run starts on, as the planner sees it. The ranks: `launched_ranks` when a
// launcher started them (`ranks_per_host` of them a host, 0 when it does not say), else
// every visible GPU on CUDA, or one CPU rank (which uses every core). The device: the
// preset of the GPU's model (h100-sxm's rates for a model without one) with the GPU's
// own memory; or the cpu preset with the host's memory (host_memory_total) shared by its
// ranks, a tenth of it kept for everything else. Every input is the same on every rank,
// so ranks that choose for themselves choose alike.
Cluster local_machine(const Config& config, int launched_ranks, int ranks_per_host);

struct AutoLayout {
  Config config;                  // the config with the layout chosen (parallel.layout: manual)
  std::vector<std::string> sets;  // the --set lines that reproduce the choice
  PlanRow row;                    // its prediction
};

// The fastest layout that fits `machine`, for the config's model and global batch
// (dp * micro_batches * micro_batch_size sequences, as written): tp, cp (where the
// planner considers it: CPU ranks, seq_len >= 8192), pp, dp, the schedule and its
// virtual stages, the micro-batch size, recomputation, SP and ZeRO-1. Each of
// parallel.tp, cp, pp, dp, virtual_stages, schedule, sequence_parallel, zero and
// train.recompute that the config gives is kept, and so is the number of stages that a
// layers_per_stage list implies. InputError when no layout fits, naming the least memory
// one needs.
AutoLayout choose_layout(const Config& config, const Cluster& machine);

// "8 x NVIDIA H100 80GB HBM3 (79.1 GiB each)", for messages.
std::string describe_machine(const Cluster& machine);

}  // namespace pptrain
