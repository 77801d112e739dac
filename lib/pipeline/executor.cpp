#include "pipeline/executor.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "pipeline/send_waits.hpp"

namespace pptrain {

std::vector<std::pair<int, int>> split_layers(int n_layer, int parts, const std::vector<int>& counts) {
  std::vector<std::pair<int, int>> ranges;
  int begin = 0;
  for (int p = 0; p < parts; ++p) {
    const int n = counts.empty() ? n_layer / parts + (p < n_layer % parts ? 1 : 0) : counts[size_t(p)];
    ranges.emplace_back(begin, begin + n);
    begin += n;
  }
  PPTRAIN_CHECK(begin == n_layer, "layer split does not cover the model");
  return ranges;
}

ModelPartition pipeline_partition(const ModelConfig& model, const Placement& placement, int stage,
                                  int tp_size, int tp_rank, const std::vector<int>& layers_per_stage) {
  const int parts = placement.virtual_stages();
  const auto ranges = split_layers(model.n_layer, parts, layers_per_stage);
  ModelPartition part;
  part.tp_size = tp_size;
  part.tp_rank = tp_rank;
  part.tied_copy_on_last = placement.head_stage() != 0;
  for (int c = 0; c < placement.chunks(); ++c) {
    const int vs = placement.virtual_stage(stage, c);
    part.chunks.push_back({ranges[size_t(vs)].first, ranges[size_t(vs)].second, vs == 0,
                           vs == parts - 1});
  }
  return part;
}

std::vector<comm::PipelineChannel> pipeline_channels(const Placement& placement,
                                                     const std::vector<std::vector<int>>& pipelines) {
  std::vector<comm::PipelineChannel> out;
  for (const std::vector<int>& ranks : pipelines)
    for (int s = 0; s < placement.pp(); ++s)
      for (int c = 0; c < placement.chunks(); ++c) {
        if (placement.is_last(s, c)) continue;
        const int next = message_peer(placement, s, {Op::SendForward, 0, c}).stage;
        if (next == s) continue;  // a local copy
        for (const comm::PipelineChannel& ch :
             {comm::PipelineChannel{ranks[size_t(s)], ranks[size_t(next)], kActivationChannel},
              comm::PipelineChannel{ranks[size_t(next)], ranks[size_t(s)], kGradientChannel}})
          if (std::find(out.begin(), out.end(), ch) == out.end()) out.push_back(ch);
      }
  return out;
}

PipelineExecutor::PipelineExecutor(StageModel& model, comm::World& world, std::vector<int> pp_ranks,
                                   ScheduleKind kind, int stage, int micro_batches,
                                   int virtual_stages, MessageMode mode,
                                   const StageCosts& planned)
    : PipelineExecutor(model, world, pp_ranks,
                       schedule_placement(kind, int(pp_ranks.size()), virtual_stages),
                       build_all_steps(kind, int(pp_ranks.size()), micro_batches, virtual_stages,
                                       mode, planned),
                       stage, micro_batches, {}) {
  if (sends_in_background(mode))
    reusable_ = sends_waitable_from(all_steps_, placement_)[size_t(stage)];
}

PipelineExecutor::PipelineExecutor(StageModel& model, comm::World& world, std::vector<int> pp_ranks,
                                   const Placement& placement, std::vector<std::vector<Step>> steps,
                                   int stage, int micro_batches, std::vector<std::size_t> reusable)
    : model_(model),
      world_(world),
      pp_ranks_(std::move(pp_ranks)),
      placement_(placement),
      all_steps_(std::move(steps)),
      pp_(int(pp_ranks_.size())),
      stage_(stage),
      m_(micro_batches),
      v_(placement.chunks()),
      reusable_(std::move(reusable)),
      pool_(size_t(v_)),
      tokens_(model.micro_batch_tokens()),
      targets_(tokens_.size()) {}

StageModel::Set& PipelineExecutor::acquire(const Key& key) {
  auto it = live_.find(key);
  if (it != live_.end()) return *it->second;
  auto& pool = pool_[size_t(key.second)];
  if (pool.empty()) reuse_drained(key.second);
  std::unique_ptr<StageModel::Set> a;
  if (pool.empty()) {
    a = model_.new_set(key.second);
  } else {
    a = std::move(pool.back());
    pool.pop_back();
  }
  return *(live_[key] = std::move(a));
}

void PipelineExecutor::release(const Key& key) {
  // A set whose sends were left to complete in the background waits in `draining_` until
  // the step from which the plan reuses it: waiting for its sends any earlier could
  // deadlock (the receiver may post its receive only after its own sends), and reusing
  // it earlier when they happen to be done would make the memory depend on timing.
  auto it = live_.find(key);
  model_.release_parts(*it->second);
  auto s = sends_.find(key);
  if (s != sends_.end()) {
    // Its sends may still read the output and the input gradient; nothing else is read.
    model_.return_boundary(*it->second, Slot::output_grad);
    if (model_.partition().chunks[size_t(key.second)].last)
      model_.return_boundary(*it->second, Slot::output);
    const auto from = reuse_from_.find(key);
    draining_.push_back({key.second, from->second, std::move(it->second), std::move(s->second)});
    reuse_from_.erase(from);
    sends_.erase(s);
  } else {
    to_pool(key.second, std::move(it->second));
  }
  live_.erase(it);
  weight_done_.erase(key);
  gradient_sent_.erase(key);
}

void PipelineExecutor::sent(const Action& a) {
  const Key key{a.microbatch, a.chunk};
  if (a.op != Op::SendBackward) return;
  gradient_sent_.insert(key);
  if (weight_done_.count(key)) release(key);  // W already ran
}

// The message of a send or receive action, on the buffers of its activation set.
comm::Transfer PipelineExecutor::transfer(const Action& a) {
  const ChunkLocation peer = message_peer(placement_, stage_, a);
  const int rank = pp_ranks_[size_t(peer.stage)];
  const auto [offset, bytes] = model_.message_part();
  auto part = [offset = offset](ops::Act* boundary) {
    return static_cast<std::byte*>(static_cast<void*>(boundary)) + offset;
  };
  switch (a.op) {
    case Op::RecvForward:
      return {comm::Transfer::Recv, rank, part(boundary(a)), bytes,
              tag(a.microbatch, a.chunk, false), kActivationChannel};
    case Op::RecvBackward:
      return {comm::Transfer::Recv, rank, part(boundary(a)), bytes,
              tag(a.microbatch, a.chunk, true), kGradientChannel};
    case Op::SendForward:
      return {comm::Transfer::Send, rank, part(boundary(a)), bytes,
              tag(a.microbatch, peer.chunk, false), kActivationChannel};
    case Op::SendBackward:
      return {comm::Transfer::Send, rank, part(boundary(a)), bytes,
              tag(a.microbatch, peer.chunk, true), kGradientChannel};
    default:
      throw std::logic_error("transfer: not a send or receive");
  }
}

// The boundary array a send or receive action moves.
ops::Act* PipelineExecutor::boundary(const Action& a) {
  StageModel::Set& acts = acquire({a.microbatch, a.chunk});
  switch (a.op) {
    case Op::RecvForward: return model_.input_buffer(acts);
    case Op::RecvBackward: return model_.output_grad(acts);
    case Op::SendForward: return model_.output(acts);
    case Op::SendBackward: return model_.input_grad(acts);
    default: throw std::logic_error("boundary: not a send or receive");
  }
}

// The set of the chunk on this rank that the message of `a` goes to, when it is local.
StageModel::Set* PipelineExecutor::local_peer(const Action& a) {
  if (!is_local_send(placement_, stage_, a)) return nullptr;
  return &acquire({a.microbatch, message_peer(placement_, stage_, a).chunk});
}

void PipelineExecutor::to_pool(int chunk, std::unique_ptr<StageModel::Set> acts) {
  model_.release_boundaries(*acts);
  pool_[size_t(chunk)].push_back(std::move(acts));
}

// Tags name the message by the receiving side's (microbatch, chunk) and direction.
int PipelineExecutor::tag(int microbatch, int chunk, bool backward) const {
  return ((microbatch * v_ + chunk) * 2 + (backward ? 1 : 0)) % 32768;
}

namespace {
// Calls chunk_done(c) once chunk c's gradients are final: all its weight passes have run
// and, for the chunk holding the token embedding, those of a head chunk on this rank
// that adds to the same tied weight.
class ChunkCompletion {
 public:
  ChunkCompletion(const std::vector<ChunkSpec>& chunks, int micro_batches,
                  const std::function<void(int)>& chunk_done)
      : m_(micro_batches), inputs_(chunks.size(), 0), weights_(chunks.size(), 0),
        reported_(chunks.size(), false),
        chunk_done_(chunk_done) {
    for (int c = 0; c < int(chunks.size()); ++c) {
      if (chunks[size_t(c)].first) first_ = c;
      if (chunks[size_t(c)].last) last_ = c;
    }
  }
  // Whether the next input (weight) pass of `chunk` is its last of the step.
  bool last_input(int chunk) { return ++inputs_[size_t(chunk)] == m_; }
  bool last_weight(int chunk) const { return weights_[size_t(chunk)] + 1 == m_; }
  void weight_done(int chunk) {
    ++weights_[size_t(chunk)];
    for (int c = 0; c < int(weights_.size()) && chunk_done_; ++c)
      if (!reported_[size_t(c)] && final(c)) {
        reported_[size_t(c)] = true;
        chunk_done_(c);
      }
  }

 private:
  bool final(int c) const {
    const bool own = weights_[size_t(c)] == m_;
    return own && (c != first_ || last_ < 0 || weights_[size_t(last_)] == m_);
  }
  int m_, first_ = -1, last_ = -1;
  std::vector<int> inputs_, weights_;
  std::vector<bool> reported_;
  const std::function<void(int)>& chunk_done_;
};
}  // namespace

// Runs a step of messages: a batch waited for, or sends left to complete.
void PipelineExecutor::communicate(const Step& step) {
  if (step.kind == Step::Messages) {
    std::vector<comm::Transfer> transfers;
    for (const Action& m : step.actions) transfers.push_back(transfer(m));
    world_.exchange(transfers);
    for (const Action& m : step.actions)
      if (m.op == Op::RecvForward || m.op == Op::RecvBackward) model_.complete_message(boundary(m));
    // The batch is done (or, on a device, ordered before what reuses its arrays): a sent
    // output is read no more.
    for (const Action& m : step.actions)
      if (m.op == Op::SendForward) model_.return_boundary(*live_.at({m.microbatch, m.chunk}), Slot::output);
  } else {
    for (const Action& m : step.actions) {
      const Key key{m.microbatch, m.chunk};
      sends_[key].push_back(world_.exchange_start({transfer(m)}));
      std::size_t& from = reuse_from_[key];
      from = std::max(from, reusable_[step_]);
    }
  }
  for (const Action& m : step.actions) sent(m);
}

void PipelineExecutor::train_step(const BatchFn& batch, float loss_scale, double* loss_total,
                                  const GradHooks& hooks) {
  ops::Ops& ops = model_.backend();
  const auto& chunks = model_.partition().chunks;
  ChunkCompletion completion(chunks, m_, hooks.chunk_done);
  const StageModel::LayerFn none;
  peak_activations_ = 0;
  started_ = Clock::now();
  first_mark_ = ops.mark();
  for (step_ = 0; step_ < steps().size(); ++step_) {
    const Step& step = steps()[step_];
    const Action& a = step.actions[0];
    const Key key{a.microbatch, a.chunk};
    const ChunkSpec& spec = chunks[size_t(a.chunk)];
    if (step.kind == Step::Messages || step.kind == Step::PostSends) {
      communicate(step);
    } else if (step.kind == Step::LocalCopy) {
      sent(a);  // the pass wrote straight into the other set
    } else if (a.op == Op::Forward) {
      StageModel::Set& acts = acquire(key);
      if (!spec.last)
        if (StageModel::Set* next = local_peer({Op::SendForward, a.microbatch, a.chunk}))
          model_.output_into(acts, model_.input_buffer(*next));
      int32_t *tokens = tokens_of(a.microbatch), *targets = targets_of(a.microbatch);
      if ((spec.first || spec.last) && !batches_) batch(a.microbatch, tokens, targets);
      model_.forward(a.chunk, acts, tokens, model_.input_buffer(acts), targets, loss_scale,
                     loss_total);
    } else if (a.op == Op::BackwardInput) {
      StageModel::Set& acts = acquire(key);
      if (!spec.first)
        if (StageModel::Set* previous = local_peer({Op::SendBackward, a.microbatch, a.chunk}))
          model_.input_grad_into(acts, model_.output_grad(*previous));
      model_.backward_input(a.chunk, acts, completion.last_input(a.chunk) ? hooks.layer_done : none);
    } else {
      model_.backward_weight(a.chunk, acquire(key),
                             completion.last_weight(a.chunk) ? hooks.layer_done : none);
      // The input gradient may still have to be sent (schedules that run W first).
      weight_done_.insert(key);
      if (spec.first || gradient_sent_.count(key)) release(key);
      completion.weight_done(a.chunk);
    }
    ops.mark();  // the step's end: no wait, the marks are read after the step
    if (hooks.progress) hooks.progress();
    peak_activations_ = std::max(peak_activations_, int(live_.size() + draining_.size()));
  }
  PPTRAIN_CHECK(live_.empty(), "activations left after the schedule");
  drain();
  ops.mark();
}

void PipelineExecutor::keep_batches_in_host_memory() {
  ops::Ops& ops = model_.backend();
  const std::size_t bytes = 2 * std::size_t(m_) * tokens_.size() * sizeof(int32_t);
  batches_ = {static_cast<int32_t*>(ops.allocate_host(bytes)), {&ops}};
}

int32_t* PipelineExecutor::tokens_of(int mb) {
  return batches_ ? batches_.get() + 2 * std::size_t(mb) * tokens_.size() : tokens_.data();
}
int32_t* PipelineExecutor::targets_of(int mb) {
  return batches_ ? tokens_of(mb) + tokens_.size() : targets_.data();
}

void PipelineExecutor::fill_batches(const BatchFn& batch) {
  PPTRAIN_CHECK(batches_ != nullptr, "fill_batches: the batches are not kept in host memory");
  for (const ChunkSpec& spec : model_.partition().chunks)
    if (spec.first || spec.last) {
      for (int mb = 0; mb < m_; ++mb) batch(mb, tokens_of(mb), targets_of(mb));
      return;
    }
}

PipelineStats PipelineExecutor::step_stats(const std::vector<double>& marks,
                                           const ActionFn& on_action) const {
  PPTRAIN_CHECK(marks.size() >= first_mark_ + steps().size() + 2, "step_stats: marks missing");
  const double* at = marks.data() + first_mark_;
  PipelineStats stats;
  stats.peak_activations = peak_activations_;
  auto host_time = [&](double s) {
    return started_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s - at[0]));
  };
  for (std::size_t i = 0; i < steps().size(); ++i) {
    const Step& step = steps()[i];
    const Op op = step.actions[0].op;
    const bool compute = step.kind == Step::Compute;
    const double s = at[i + 1] - at[i];
    (compute ? stats.compute_s : stats.wait_s) += s;
    if (compute)
      (op == Op::Forward ? stats.forward_s
       : op == Op::BackwardInput ? stats.backward_input_s : stats.backward_weight_s) += s;
    if (on_action)
      for (const Action& m : step.actions) on_action(m, host_time(at[i]), host_time(at[i + 1]));
  }
  stats.wait_s += at[steps().size() + 1] - at[steps().size()];  // the final drain
  stats.elapsed_s = at[steps().size() + 1] - at[0];
  return stats;
}

// Forward only, one micro-batch at a time through the virtual stages in order: each
// message is a lone blocking send or receive, and the chain never closes a cycle.
double PipelineExecutor::evaluate(int count, const BatchFn& batch, std::vector<float>* losses_out) {
  double loss_sum = 0;
  for (int mb = 0; mb < count; ++mb) {
    for (int c = 0; c < v_; ++c) {  // a rank's chunks come in virtual-stage order
      const ChunkSpec& spec = model_.partition().chunks[size_t(c)];
      const Key key{mb, c};
      StageModel::Set& acts = acquire(key);
      const Action receive{Op::RecvForward, mb, c}, send{Op::SendForward, mb, c};
      if (!spec.first && placement_.previous(stage_, c).stage != stage_) {
        world_.exchange({transfer(receive)});
        model_.complete_message(boundary(receive));
        // A last chunk's forward reads its losses back: wait for the input here, under
        // the watchdog, rather than in that unwatched read.
        if (spec.last) model_.backend().wait_queue([&] { world_.check_progress(); });
      }
      if (spec.first || spec.last) batch(mb, tokens_.data(), targets_.data());
      loss_sum += model_.forward(c, acts, tokens_.data(), model_.input_buffer(acts),
                                 targets_.data(), 0.0f, nullptr);
      if (spec.last && losses_out) {
        const std::vector<float>& l = model_.position_losses(acts);
        losses_out->insert(losses_out->end(), l.begin(), l.end());
      }
      if (!spec.last) {
        if (StageModel::Set* next = local_peer(send))
          model_.backend().copy(model_.input_buffer(*next), model_.output(acts), model_.boundary_bytes());
        else
          world_.exchange({transfer(send)});
      }
      release(key);
    }
  }
  // The last sends are queued on a device: done before the host's own collectives.
  model_.backend().wait_queue([&] { world_.check_progress(); });
  return loss_sum;
}

void PipelineExecutor::reuse_drained(int chunk) {
  auto due = draining_.end();
  for (auto it = draining_.begin(); it != draining_.end(); ++it) {
    if (it->chunk != chunk || it->reusable_from > step_) continue;
    const bool sent = std::all_of(it->sends.begin(), it->sends.end(),
                                  [](const auto& op) { return op->test(); });
    if (sent || due == draining_.end()) due = it;
    if (sent) break;
  }
  if (due == draining_.end()) return;
  // Cannot deadlock from this step on. On a device the compute stream waits, not the host.
  for (auto& op : due->sends) op->wait_in_queue();
  to_pool(due->chunk, std::move(due->acts));
  draining_.erase(due);
}

void PipelineExecutor::drain() {
  for (Draining& d : draining_) {
    for (auto& op : d.sends) op->wait_in_queue();
    to_pool(d.chunk, std::move(d.acts));
  }
  draining_.clear();
}

}  // namespace pptrain
