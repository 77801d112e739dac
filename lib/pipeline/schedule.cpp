// Schedule builders: one small function per kind, all writing through ListBuilder so
// that every compute action carries its sends and receives the same way.
#include "pipeline/schedule.hpp"

#include <algorithm>
#include <stdexcept>

#include "pipeline/zb_v.hpp"

namespace pptrain {

std::string schedule_constraint_error(ScheduleKind kind, int pp, int micro_batches,
                                      int virtual_stages) {
  const std::string name(name_of(kind));
  if (pp < 1) return "pp must be >= 1 (got " + std::to_string(pp) + ")";
  if (micro_batches < 1)
    return "micro_batches must be >= 1 (got " + std::to_string(micro_batches) + ")";
  if (kind == ScheduleKind::ZeroBubbleV) {
    if (virtual_stages != 2)
      return "zb-v needs virtual_stages = 2 (got " + std::to_string(virtual_stages) + ")";
    return "";
  }
  if (kind != ScheduleKind::Interleaved) {
    if (virtual_stages != 1)
      return "virtual_stages must be 1 for " + name + " (got " +
             std::to_string(virtual_stages) + ")";
    return "";
  }
  if (virtual_stages < 2)
    return "interleaved needs virtual_stages >= 2 (got " + std::to_string(virtual_stages) + ")";
  if (pp < 2) return "interleaved needs pp >= 2 (got " + std::to_string(pp) + ")";
  if (micro_batches % pp != 0)
    return "interleaved needs micro_batches to be a multiple of pp (got " +
           std::to_string(micro_batches) + " and " + std::to_string(pp) + ")";
  return "";
}

bool weight_follows_input(ScheduleKind kind) {
  return kind != ScheduleKind::ZeroBubbleH1 && kind != ScheduleKind::ZeroBubbleV;
}

Placement schedule_placement(ScheduleKind kind, int pp, int virtual_stages) {
  return Placement(kind == ScheduleKind::ZeroBubbleV ? PlacementKind::V : PlacementKind::Looped,
                   pp, virtual_stages);
}

const char* op_name(Op op) {
  switch (op) {
    case Op::RecvForward: return "RecvForward";
    case Op::Forward: return "Forward";
    case Op::SendForward: return "SendForward";
    case Op::RecvBackward: return "RecvBackward";
    case Op::BackwardInput: return "BackwardInput";
    case Op::SendBackward: return "SendBackward";
    case Op::BackwardWeight: return "BackwardWeight";
  }
  return "?";
}

std::string to_string(const Action& a) {
  return std::string(op_name(a.op)) + "(mb " + std::to_string(a.microbatch) + ", chunk " +
         std::to_string(a.chunk) + ")";
}

ChunkLocation message_peer(const Placement& placement, int stage, const Action& a) {
  const bool towards_next = a.op == Op::SendForward || a.op == Op::RecvBackward;
  return towards_next ? placement.next(stage, a.chunk) : placement.previous(stage, a.chunk);
}

MessageKey message_key(const Placement& placement, int stage, const Action& a) {
  const ChunkLocation peer = message_peer(placement, stage, a);
  const int kind = (a.op == Op::SendForward || a.op == Op::RecvForward) ? 0 : 1;
  return is_send(a.op) ? MessageKey{stage, peer.stage, kind, a.microbatch, peer.chunk}
                       : MessageKey{peer.stage, stage, kind, a.microbatch, a.chunk};
}

bool is_local_send(const Placement& placement, int stage, const Action& a) {
  return is_send(a.op) && message_peer(placement, stage, a).stage == stage;
}

namespace {

// Appends compute actions of one stage together with the messages they need.
class ListBuilder {
 public:
  ListBuilder(const Placement& placement, int stage) : placement_(placement), stage_(stage) {}

  void forward(int mb, int chunk) {
    if (!placement_.is_first(stage_, chunk) && !local(placement_.previous(stage_, chunk)))
      add(Op::RecvForward, mb, chunk);
    add(Op::Forward, mb, chunk);
    if (!placement_.is_last(stage_, chunk)) add(Op::SendForward, mb, chunk);
  }
  // B and, with with_weight, its W before the gradient leaves (the classic backward).
  void backward(int mb, int chunk, bool with_weight) {
    if (!placement_.is_last(stage_, chunk) && !local(placement_.next(stage_, chunk)))
      add(Op::RecvBackward, mb, chunk);
    add(Op::BackwardInput, mb, chunk);
    if (with_weight) add(Op::BackwardWeight, mb, chunk);
    if (!placement_.is_first(stage_, chunk)) add(Op::SendBackward, mb, chunk);
  }
  void weight(int mb, int chunk) { add(Op::BackwardWeight, mb, chunk); }

  std::vector<Action> take() { return std::move(list_); }

 private:
  bool local(const ChunkLocation& peer) const { return peer.stage == stage_; }
  void add(Op op, int mb, int chunk) { list_.push_back({op, mb, chunk}); }
  Placement placement_;
  int stage_;
  std::vector<Action> list_;
};

Placement looped(int pp, int v) { return Placement(PlacementKind::Looped, pp, v); }

std::vector<Action> build_gpipe(int pp, int stage, int m) {
  ListBuilder b(looped(pp, 1), stage);
  for (int mb = 0; mb < m; ++mb) b.forward(mb, 0);
  for (int mb = 0; mb < m; ++mb) b.backward(mb, 0, /*with_weight=*/true);
  return b.take();
}

int one_f_one_b_warmup(int pp, int stage, int m) { return std::min(m, pp - stage - 1); }

std::vector<Action> build_1f1b(int pp, int stage, int m) {
  ListBuilder b(looped(pp, 1), stage);
  const int warmup = one_f_one_b_warmup(pp, stage, m);
  // Warm-up: forwards only, filling the pipeline below this stage.
  for (int mb = 0; mb < warmup; ++mb) b.forward(mb, 0);
  // Steady state: each new forward is followed by the oldest pending backward.
  for (int k = 0; k < m - warmup; ++k) {
    b.forward(k + warmup, 0);
    b.backward(k, 0, /*with_weight=*/true);
  }
  // Cool-down: the remaining backwards drain the pipeline.
  for (int mb = m - warmup; mb < m; ++mb) b.backward(mb, 0, /*with_weight=*/true);
  return b.take();
}

// ZB-H1: 1F1B's order of forwards and Bs, but the gradient is sent right after B, and
// stage s runs the W of microbatch k - s after the B of microbatch k. Every stage then
// holds up to pp sets in flight (the first stage's 1F1B peak), and the s Ws still
// pending when the Bs are done fill the cool-down bubble.
std::vector<Action> build_zb_h1(int pp, int stage, int m) {
  ListBuilder b(looped(pp, 1), stage);
  const int warmup = one_f_one_b_warmup(pp, stage, m);
  int next_weight = 0;
  auto backward_then_deferred_weight = [&](int mb) {
    b.backward(mb, 0, /*with_weight=*/false);
    if (mb - next_weight >= stage) b.weight(next_weight++, 0);
  };
  // Warm-up: forwards only.
  for (int mb = 0; mb < warmup; ++mb) b.forward(mb, 0);
  // Steady state: one forward, one B, and the W deferred by `stage` microbatches.
  for (int k = 0; k < m - warmup; ++k) {
    b.forward(k + warmup, 0);
    backward_then_deferred_weight(k);
  }
  // Cool-down: remaining Bs (each with a deferred W), then the Ws still pending.
  for (int mb = m - warmup; mb < m; ++mb) backward_then_deferred_weight(mb);
  while (next_weight < m) b.weight(next_weight++, 0);
  return b.take();
}

int interleaved_warmup(int pp, int stage, int m, int v) {
  if (m == pp) return m * v;  // Megatron runs every forward first in this case
  return std::min(m * v, (pp - stage - 1) * 2 + (v - 1) * pp);
}

// Megatron's interleaved 1F1B. The k-th forward of every stage is microbatch
// (k / (pp*v)) * pp + k % pp on chunk (k % (pp*v)) / pp: groups of pp microbatches go
// through chunk 0, then chunk 1, ...; backwards visit the chunks in reverse.
std::vector<Action> build_interleaved(int pp, int stage, int m, int v) {
  ListBuilder b(looped(pp, v), stage);
  const int group = pp * v;
  const int total = m * v;
  auto microbatch = [&](int k) { return (k / group) * pp + k % pp; };
  auto forward_chunk = [&](int k) { return (k % group) / pp; };
  auto backward_chunk = [&](int k) { return v - 1 - forward_chunk(k); };
  const int warmup = interleaved_warmup(pp, stage, m, v);
  // Warm-up: forwards only.
  for (int k = 0; k < warmup; ++k) b.forward(microbatch(k), forward_chunk(k));
  // Steady state: one forward, then one backward.
  for (int k = 0; k < total - warmup; ++k) {
    b.forward(microbatch(k + warmup), forward_chunk(k + warmup));
    b.backward(microbatch(k), backward_chunk(k), /*with_weight=*/true);
  }
  // Cool-down: the remaining backwards.
  for (int k = total - warmup; k < total; ++k)
    b.backward(microbatch(k), backward_chunk(k), /*with_weight=*/true);
  return b.take();
}

// ZB-V: one stage's part of the list scheduler's compute order, with its messages.
std::vector<Action> build_zb_v(int pp, int stage, const std::vector<Action>& order) {
  ListBuilder b(Placement(PlacementKind::V, pp, 2), stage);
  for (const Action& a : order) {
    if (a.op == Op::Forward) b.forward(a.microbatch, a.chunk);
    else if (a.op == Op::BackwardInput) b.backward(a.microbatch, a.chunk, /*with_weight=*/false);
    else b.weight(a.microbatch, a.chunk);
  }
  return b.take();
}

void require_valid(ScheduleKind kind, int pp, int stage, int m, int v) {
  const std::string error = schedule_constraint_error(kind, pp, m, v);
  if (!error.empty()) throw std::invalid_argument(error);
  if (stage < 0 || stage >= pp)
    throw std::invalid_argument("stage " + std::to_string(stage) + " is outside 0.." +
                                std::to_string(pp - 1));
}

}  // namespace

std::vector<Action> build_schedule(ScheduleKind kind, int pp, int stage, int micro_batches,
                                   int virtual_stages, const StageCosts& planned) {
  require_valid(kind, pp, stage, micro_batches, virtual_stages);
  switch (kind) {
    case ScheduleKind::GPipe: return build_gpipe(pp, stage, micro_batches);
    case ScheduleKind::OneFOneB: return build_1f1b(pp, stage, micro_batches);
    case ScheduleKind::Interleaved:
      return build_interleaved(pp, stage, micro_batches, virtual_stages);
    case ScheduleKind::ZeroBubbleH1: return build_zb_h1(pp, stage, micro_batches);
    case ScheduleKind::ZeroBubbleV:
      return build_zb_v(pp, stage, zb_v_compute_order(pp, micro_batches, planned)[size_t(stage)]);
  }
  throw std::invalid_argument("unknown schedule kind");
}

std::vector<std::vector<Action>> build_schedules(ScheduleKind kind, int pp, int micro_batches,
                                                 int virtual_stages, const StageCosts& planned) {
  require_valid(kind, pp, 0, micro_batches, virtual_stages);
  std::vector<std::vector<Action>> lists;
  if (kind == ScheduleKind::ZeroBubbleV) {
    const auto orders = zb_v_compute_order(pp, micro_batches, planned);
    for (int s = 0; s < pp; ++s) lists.push_back(build_zb_v(pp, s, orders[size_t(s)]));
  } else {
    for (int s = 0; s < pp; ++s)
      lists.push_back(build_schedule(kind, pp, s, micro_batches, virtual_stages));
  }
  return lists;
}

std::vector<std::vector<Step>> build_all_steps(ScheduleKind kind, int pp, int micro_batches,
                                               int virtual_stages, MessageMode mode,
                                               const StageCosts& planned) {
  return batch_messages(build_schedules(kind, pp, micro_batches, virtual_stages, planned),
                        schedule_placement(kind, pp, virtual_stages), mode);
}

std::vector<Step> build_steps(ScheduleKind kind, int pp, int stage, int micro_batches,
                              int virtual_stages, MessageMode mode, const StageCosts& planned) {
  require_valid(kind, pp, stage, micro_batches, virtual_stages);
  return build_all_steps(kind, pp, micro_batches, virtual_stages, mode, planned)[size_t(stage)];
}

int activation_bound(ScheduleKind kind, int pp, int stage, int micro_batches,
                     int virtual_stages) {
  require_valid(kind, pp, stage, micro_batches, virtual_stages);
  const int m = micro_batches;
  switch (kind) {
    case ScheduleKind::GPipe: return m * virtual_stages;
    case ScheduleKind::OneFOneB: return std::min(m, pp - stage);
    case ScheduleKind::ZeroBubbleH1: return std::min(m, pp);
    case ScheduleKind::ZeroBubbleV: return std::min(2 * m, zb_v_set_limit(pp));
    case ScheduleKind::Interleaved: {
      const int total = m * virtual_stages;
      return std::min(total, interleaved_warmup(pp, stage, m, virtual_stages) + 1);
    }
  }
  throw std::invalid_argument("unknown schedule kind");
}

int backward_bound(ScheduleKind kind, int pp, int stage, int micro_batches,
                   int virtual_stages) {
  if (kind == ScheduleKind::ZeroBubbleH1) {
    require_valid(kind, pp, stage, micro_batches, virtual_stages);
    return std::min(micro_batches, pp - stage);
  }
  return activation_bound(kind, pp, stage, micro_batches, virtual_stages);
}

}  // namespace pptrain
