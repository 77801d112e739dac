// Pipeline-parallel schedules as data: the ordered list of actions each pipeline rank
// runs in one training step (forwards, split backwards, and the point-to-point
// messages between them), and the steps made from them by batching the messages. Pure
// functions; the executor runs the steps and the simulator (simulator.hpp) runs all
// ranks' steps together to prove them.
#pragma once
#include <string>
#include <tuple>
#include <vector>

#include "config/choices.hpp"
#include "pipeline/placement.hpp"

namespace pptrain {

// "" when the schedule can run with these sizes, otherwise the reason in one line.
// All kinds need pp, micro_batches, virtual_stages >= 1. gpipe, 1f1b and zb-h1 need
// virtual_stages == 1. interleaved (Megatron's rules) needs pp >= 2,
// virtual_stages >= 2 and micro_batches a multiple of pp. zb-v needs virtual_stages == 2.
std::string schedule_constraint_error(ScheduleKind kind, int pp, int micro_batches,
                                      int virtual_stages);

// Whether every micro-batch's W runs right after its B (gpipe, 1f1b, interleaved), so
// that a model can run them together layer by layer; false for zb-h1 and zb-v.
bool weight_follows_input(ScheduleKind kind);

// The placement a schedule runs on: V for zb-v, looped for every other kind.
Placement schedule_placement(ScheduleKind kind, int pp, int virtual_stages);

enum class Op {
  RecvForward,     // receive the input activation of (microbatch, chunk)
  Forward,         // forward through the chunk's layers (the last virtual stage adds the loss)
  SendForward,     // send the chunk's output activation to the next virtual stage
  RecvBackward,    // receive the gradient of the chunk's output
  BackwardInput,   // B: gradient with respect to the chunk's input
  SendBackward,    // send that input gradient to the previous virtual stage
  BackwardWeight,  // W: gradients of the chunk's weights
};

// One action of one pipeline rank. `chunk` is the local model chunk (0..v-1); the
// schedule's placement maps it to a virtual stage. Activations of (microbatch, chunk)
// flow to the next virtual stage, gradients to the previous one. A send to a virtual
// stage on the same rank is a local copy, and has no receive.
struct Action {
  Op op;
  int microbatch;
  int chunk;
  bool operator==(const Action&) const = default;
};

const char* op_name(Op op);
std::string to_string(const Action& action);  // e.g. "Forward(mb 2, chunk 0)"

inline bool is_send(Op op) { return op == Op::SendForward || op == Op::SendBackward; }
inline bool is_receive(Op op) { return op == Op::RecvForward || op == Op::RecvBackward; }
inline bool is_compute(Op op) { return !is_send(op) && !is_receive(op); }

// Where a send goes or a receive comes from: the neighbouring virtual stage's location
// (activations go to the next virtual stage, gradients to the previous one).
ChunkLocation message_peer(const Placement& placement, int stage, const Action& a);
// A message's name, the same at both of its ends: sender stage, receiver stage, kind (0
// activation, 1 gradient), micro-batch, receiver's chunk.
using MessageKey = std::tuple<int, int, int, int, int>;
MessageKey message_key(const Placement& placement, int stage, const Action& a);
// A send whose peer is on the same stage: a local copy, never a message.
bool is_local_send(const Placement& placement, int stage, const Action& a);

// Cost of one action on a stage's whole layer range; a chunk costs its share of the
// stage's layers (1/v of them when split evenly). p2p is the latency of one batch.
struct StageCosts {
  double forward = 1, backward_input = 1, backward_weight = 1, p2p = 0;
};

// How a rank's messages travel. Each is proven by the simulator under unbuffered
// point-to-point semantics (a send completes only once its receive is posted).
//   Grouped: batches of sends and receives that are posted together and complete
//            together (one NCCL group on the compute stream). Messages between two
//            ranks match in issue order.
//   AsyncSends: each send is posted right after the compute that produced it and
//            completes in the background (MPI_Isend; waited for when its set is reused
//            and by the end of the step); the rank waits only in receives, posted just
//            before the compute that needs them. Messages match by name (MPI tags).
//   Channels: AsyncSends' steps on NCCL. Every (sender, receiver, kind) of message is a
//            channel of its own (a two-rank communicator and a stream on each side);
//            a channel's messages match, and complete, in issue order.
enum class MessageMode { Grouped, AsyncSends, Channels };
// Whether sends are left to complete in the background (AsyncSends, Channels).
inline bool sends_in_background(MessageMode mode) { return mode != MessageMode::Grouped; }

// One step of a rank's schedule, run as a unit: a single compute action, a single local
// copy, a batch of messages that the rank waits for (all of them in Grouped mode; only
// receives otherwise), or sends posted without waiting (AsyncSends and Channels).
struct Step {
  enum Kind { Compute, LocalCopy, Messages, PostSends } kind;
  std::vector<Action> actions;  // exactly one for Compute and LocalCopy
  bool operator==(const Step&) const = default;
};

// The rule that decides which messages travel together (batching.cpp), a pure function
// of every stage's action list.
// Grouped: it times the compute actions on a nominal clock (each F, B and W its chunk's
// share of one unit, messages free) and gives every message the round at which its
// consumer starts; each stage then runs one batch per round at that point of its list:
// receives just before the compute that needs them, sends deferred until the peer needs
// them. Both ends of a message are in the same round, so whatever the real timing, no
// stage can wait on a later round of another: every round completes. Within a batch the
// messages are sorted the same way on both sides, so per-peer issue orders agree.
// AsyncSends and Channels: the list's own order; consecutive sends become one PostSends step and
// consecutive receives one Messages step. Only receives wait, so the lists complete
// whenever they would with buffered messages.
// Either way a local send becomes a LocalCopy step right after its compute.
// Grouped: std::logic_error if the lists cannot run even with free messages (AsyncSends
// leaves that to the simulator, which runs the steps as they are).
std::vector<std::vector<Step>> batch_messages(const std::vector<std::vector<Action>>& lists,
                                              const Placement& placement,
                                              MessageMode mode = MessageMode::Grouped);

// The ordered action list of `stage` (0-based). Each Forward is preceded by its
// RecvForward and followed by its SendForward, each BackwardInput preceded by its
// RecvBackward and followed by its SendBackward, where those messages exist (the first
// virtual stage receives no activation and sends no gradient; the last sends no
// activation and receives no gradient: it computes the loss; a neighbour on the same
// rank gets a local SendForward / SendBackward and nothing is received).
//   gpipe:       all forwards, then all backwards; B, W, then the gradient send.
//   1f1b:        warm-up min(m, pp-stage-1) forwards, steady one-forward-one-backward,
//                cool-down backwards; B, W, then the gradient send.
//   interleaved: Megatron's interleaved 1F1B over v chunks.
//   zb-h1:       1F1B's forward/B order with the gradient sent right after B; stage s
//                defers each W by s microbatches, and the deferred Ws fill the cool-down.
//   zb-v:        zero-bubble V (Qi et al., arXiv 2401.10241): two chunks in a V, the
//                order found by list-scheduling all stages together with the planned F,
//                B and W times (see zb_v.cpp); at most 2*pp chunk sets (1F1B's memory)
//                per stage.
// Throws std::invalid_argument when schedule_constraint_error is not empty or the stage
// is out of range.
// `planned`: the relative F, B and W times zb-v plans its order with (the others ignore it).
std::vector<Action> build_schedule(ScheduleKind kind, int pp, int stage, int micro_batches,
                                   int virtual_stages, const StageCosts& planned = {});
// build_schedule for every stage (zb-v's list scheduler runs once for all of them).
std::vector<std::vector<Action>> build_schedules(ScheduleKind kind, int pp, int micro_batches,
                                                 int virtual_stages,
                                                 const StageCosts& planned = {});
// What the executor runs and the simulator proves: batch_messages over build_schedules;
// build_steps is one stage's part.
std::vector<std::vector<Step>> build_all_steps(ScheduleKind kind, int pp, int micro_batches,
                                               int virtual_stages,
                                               MessageMode mode = MessageMode::Grouped,
                                               const StageCosts& planned = {});
std::vector<Step> build_steps(ScheduleKind kind, int pp, int stage, int micro_batches,
                              int virtual_stages, MessageMode mode = MessageMode::Grouped,
                              const StageCosts& planned = {});

// The most (microbatch, chunk) sets a stage holds between their Forward and their
// BackwardWeight under this schedule: gpipe m*v; 1f1b min(m, pp-stage); interleaved
// Megatron's warm-up count + 1 (m*v when m == pp); zb-h1 min(m, pp): its deferred Ws
// keep up to `stage` extra sets alive, holding what W reads (the buffers B alone reads go
// back when B ends: activation_table.hpp), while the sets
// awaiting B never exceed 1F1B's min(m, pp-stage) (see backward_bound); zb-v
// min(2m, 2pp) sets of half a stage's layers, 1F1B's first-stage memory.
int activation_bound(ScheduleKind kind, int pp, int stage, int micro_batches,
                     int virtual_stages);
// The most sets between their Forward and their BackwardInput (full activations kept).
int backward_bound(ScheduleKind kind, int pp, int stage, int micro_batches,
                   int virtual_stages);

}  // namespace pptrain
