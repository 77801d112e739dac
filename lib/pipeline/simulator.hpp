// Runs every pipeline stage's action list together in simulated time: proves a set of
// lists complete without deadlock and in a valid order, counts in-flight activations,
// and measures the bubble. Feeds the schedule tests and `pptrain plan`.
#pragma once
#include <vector>

#include "pipeline/schedule.hpp"

namespace pptrain {

// Cost of one action on a stage's whole layer range; a chunk of an interleaved stage
// holds 1/v of the layers and costs 1/v of it. p2p is the latency of one message.
struct StageCosts {
  double forward = 1, backward_input = 1, backward_weight = 1, p2p = 0;
};

struct SimulationResult {
  double makespan = 0;                 // time when the last stage finishes
  std::vector<double> busy;            // per stage: time spent in F/B/W
  double bubble = 0;                   // mean over stages of 1 - busy/makespan
  std::vector<int> peak_activations;   // per stage: max sets alive (F done, W not yet)
  std::vector<int> peak_awaiting_backward;  // per stage: max sets with F done, B not yet
};

// Runs lists[stage] for stage 0..pp-1 together. Sends complete at once (buffered).
// Messages travel on first-in-first-out channels, one per (sender, receiver,
// activation|gradient), as untagged point-to-point messages would; a receive takes the
// oldest message of its channel, at the later of its own start and the send time plus
// p2p. Compute actions take their cost. Throws std::logic_error naming stage, action
// index and action on: deadlock (every unfinished stage blocked in a receive), a receive
// whose message is never sent, a message never received, a receive that would get
// another (microbatch, chunk)'s message, a message to or from a virtual stage that has
// no such neighbour, and F/B/W order errors per (microbatch, chunk): B before its F or
// (off the last virtual stage) before its gradient arrived, F before its activation
// arrived, W before its B, any action duplicated or missing.
// std::invalid_argument if lists.size() != pp or a size is < 1.
SimulationResult simulate_lists(const std::vector<std::vector<Action>>& lists, int pp,
                                int micro_batches, int virtual_stages,
                                const StageCosts& costs = {});

// Builds every stage's list with build_schedule and simulates them.
SimulationResult simulate(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                          const StageCosts& costs = {});

// The bubble of the schedule's own lists with unit costs and free messages. Closed forms:
// gpipe and 1f1b (p-1)/(m+p-1); zb-h1 (p-1)/(3m+p-1) for m >= p (a third of 1f1b's
// bubble time); interleaved below 1f1b's (Megatron: bubble time divided by v).
double theoretical_bubble(ScheduleKind kind, int pp, int micro_batches, int virtual_stages);

}  // namespace pptrain
