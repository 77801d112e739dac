// Runs every pipeline stage's steps together in simulated time, under the strictest
// point-to-point semantics: proves that the steps the executor runs complete without
// deadlock at any message size and in a valid order, counts in-flight activations, and
// measures the bubble. Feeds the schedule tests, the trainer's theoretical bubble and
// `pptrain check-config`.
#pragma once
#include <vector>

#include "pipeline/schedule.hpp"

namespace pptrain {

struct SimulationResult {
  double makespan = 0;                 // time when the last stage finishes
  std::vector<double> busy;            // per stage: time spent in F/B/W
  double bubble = 0;                   // mean over stages of 1 - busy/makespan
  std::vector<int> peak_activations;   // per stage: max sets alive (F done, W not yet)
  std::vector<int> peak_awaiting_backward;  // per stage: max sets with F done, B not yet
};

// Runs steps[stage] for stage 0..pp-1 together. The semantics, the strictest that MPI
// without buffering and NCCL allow:
// - Nothing is buffered: a message completes only once both of its ends are posted, at
//   the later post time plus p2p. A Messages step waits until all its messages have
//   completed; a PostSends step does not wait, and its sends are waited for when the
//   stage's list ends.
// - Grouped mode: messages between two stages match in issue order (NCCL has no tags);
//   the k-th send from a to b is the k-th receive on b from a and must name the same
//   (microbatch, chunk) and kind. AsyncSends mode: they match by that name (MPI tags).
//   Channels mode: in issue order per (sender, receiver, kind), and a message completes
//   no earlier than the one before it on its channel (each end is a stream).
//   A mismatch is rejected before the run starts.
// - Compute steps take their cost; a local copy is instant.
// Throws std::logic_error naming stage, step and actions on: deadlock (with the cycle of
// stages that wait on each other and the step each waits in), a receive whose message is
// never sent, a message never received, orders that differ between sender and receiver,
// a message to a virtual stage that has no such neighbour or that lives on the same
// stage, and F/B/W order errors per (microbatch, chunk): B before its F or before its
// gradient arrived, F before its input arrived, a send before what it sends exists, W
// before its B, any action duplicated or missing. `layers_per_virtual_stage` (empty:
// even) sets each chunk's share of its stage's cost. std::invalid_argument if
// steps.size() != pp or a size is < 1.
SimulationResult simulate_steps(const std::vector<std::vector<Step>>& steps,
                                const Placement& placement, int micro_batches,
                                MessageMode mode = MessageMode::Grouped,
                                const StageCosts& costs = {},
                                const std::vector<int>& layers_per_virtual_stage = {});

// As simulate_steps, with each virtual stage's own F, B and W times for one micro-batch
// (index: virtual stage, as Placement numbers them) and a message's time p2p.
SimulationResult simulate_steps_timed(const std::vector<std::vector<Step>>& steps,
                                      const Placement& placement, int micro_batches,
                                      MessageMode mode,
                                      const std::vector<StageCosts>& virtual_stage_costs,
                                      double p2p);
// Each virtual stage's times under simulate_steps' rule: a stage's `costs` split over its
// chunks by their layers (evenly when `layers_per_virtual_stage` is empty).
std::vector<StageCosts> virtual_stage_costs(const Placement& placement, const StageCosts& costs,
                                            const std::vector<int>& layers_per_virtual_stage);

// Builds every stage's steps with build_steps (zb-v planned for `planned`) and simulates
// them with `costs`.
SimulationResult simulate(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                          const StageCosts& costs = {},
                          const std::vector<int>& layers_per_virtual_stage = {},
                          MessageMode mode = MessageMode::Grouped,
                          const StageCosts& planned = {});

// The bubble of the schedule's own steps with the planned costs (unit by default) and
// free messages. Closed forms with unit costs
// (every mode agrees there): gpipe and 1f1b (p-1)/(m+p-1); zb-h1
// (p-1)/(3m+p-1) for m >= p (a third of 1f1b's bubble time); interleaved
// (p-1)/(v*m+p-1) (Megatron: bubble time divided by v); zb-v below zb-h1 and going to
// zero with m (the paper's (p-1)(F+B-2W) idle time is zero with F = B = W, but the last
// stage still waits p-1 chunk units for its first input).
double theoretical_bubble(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                          MessageMode mode = MessageMode::Grouped,
                          const StageCosts& planned = {});

}  // namespace pptrain
