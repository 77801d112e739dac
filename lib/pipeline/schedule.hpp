// Pipeline-parallel schedules as data: the ordered list of actions each pipeline rank
// runs in one training step (forwards, split backwards, and the point-to-point
// messages between them). Pure functions; the executor runs these lists and the
// simulator (simulator.hpp) runs all ranks' lists together to check them.
#pragma once
#include <string>
#include <vector>

namespace pptrain {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };

// "gpipe" | "1f1b" | "interleaved" | "zb-h1"; std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);
std::string schedule_name(ScheduleKind kind);

// "" when the schedule can run with these sizes, otherwise the reason in one line.
// All kinds need pp, micro_batches, virtual_stages >= 1. gpipe, 1f1b and zb-h1 need
// virtual_stages == 1. interleaved (Megatron's rules) needs pp >= 2,
// virtual_stages >= 2 and micro_batches a multiple of pp.
std::string schedule_constraint_error(ScheduleKind kind, int pp, int micro_batches,
                                      int virtual_stages);

enum class Op {
  RecvForward,     // receive the input activation of (microbatch, chunk)
  Forward,         // forward through the chunk's layers (the last virtual stage adds the loss)
  SendForward,     // send the chunk's output activation to the next virtual stage
  RecvBackward,    // receive the gradient of the chunk's output
  BackwardInput,   // B: gradient with respect to the chunk's input
  SendBackward,    // send that input gradient to the previous virtual stage
  BackwardWeight,  // W: gradients of the chunk's weights
};

// One step of one pipeline rank. `chunk` is the local model chunk (0..v-1); chunk c on
// stage s is virtual stage c*pp + s. Activations of (microbatch, chunk) flow to the next
// virtual stage, gradients to the previous one.
struct Action {
  Op op;
  int microbatch;
  int chunk;
  bool operator==(const Action&) const = default;
};

const char* op_name(Op op);
std::string to_string(const Action& action);  // e.g. "Forward(mb 2, chunk 0)"

// Virtual stage of (stage, chunk) and its neighbours along the model.
inline int virtual_stage(int pp, int stage, int chunk) { return chunk * pp + stage; }
inline bool is_first_virtual_stage(int stage, int chunk) { return stage == 0 && chunk == 0; }
inline bool is_last_virtual_stage(int pp, int stage, int chunk, int virtual_stages) {
  return stage == pp - 1 && chunk == virtual_stages - 1;
}

// The ordered action list of `stage` (0-based). Each Forward is preceded by its
// RecvForward and followed by its SendForward, each BackwardInput preceded by its
// RecvBackward and followed by its SendBackward, where those messages exist (the first
// virtual stage receives no activation and sends no gradient; the last sends no
// activation and receives no gradient: it computes the loss).
//   gpipe:       all forwards, then all backwards; B, W, then the gradient send.
//   1f1b:        warm-up min(m, pp-stage-1) forwards, steady one-forward-one-backward,
//                cool-down backwards; B, W, then the gradient send.
//   interleaved: Megatron's interleaved 1F1B over v chunks.
//   zb-h1:       1F1B's forward/B order with the gradient sent right after B; stage s
//                defers each W by s microbatches, and the deferred Ws fill the cool-down.
// Throws std::invalid_argument when schedule_constraint_error is not empty or the stage
// is out of range.
std::vector<Action> build_schedule(ScheduleKind kind, int pp, int stage, int micro_batches,
                                   int virtual_stages);

// The most (microbatch, chunk) sets a stage holds between their Forward and their
// BackwardWeight under this schedule: gpipe m*v; 1f1b min(m, pp-stage); interleaved
// Megatron's warm-up count + 1 (m*v when m == pp); zb-h1 min(m, pp): its deferred Ws
// keep up to `stage` extra sets alive, holding only the inputs W needs, while the sets
// awaiting B never exceed 1F1B's min(m, pp-stage) (see backward_bound).
int activation_bound(ScheduleKind kind, int pp, int stage, int micro_batches,
                     int virtual_stages);
// The most sets between their Forward and their BackwardInput (full activations kept).
int backward_bound(ScheduleKind kind, int pp, int stage, int micro_batches,
                   int virtual_stages);

}  // namespace pptrain
