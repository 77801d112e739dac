#include "pipeline/executor.hpp"

#include <algorithm>

#include "core/error.hpp"

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

ModelPartition pipeline_partition(const ModelConfig& model, int pp, int stage, int virtual_stages,
                                  int tp_size, int tp_rank, const std::vector<int>& layers_per_stage) {
  const int parts = pp * virtual_stages;
  const auto ranges = split_layers(model.n_layer, parts, layers_per_stage);
  ModelPartition part;
  part.tp_size = tp_size;
  part.tp_rank = tp_rank;
  part.tied_copy_on_last = pp > 1;
  for (int c = 0; c < virtual_stages; ++c) {
    const int vs = virtual_stage(pp, stage, c);
    part.chunks.push_back({ranges[size_t(vs)].first, ranges[size_t(vs)].second, vs == 0,
                           vs == parts - 1});
  }
  return part;
}

PipelineExecutor::PipelineExecutor(GptModel& model, comm::World& world, std::vector<int> pp_ranks,
                                   ScheduleKind kind, int stage, int micro_batches,
                                   int virtual_stages)
    : model_(model),
      world_(world),
      pp_ranks_(std::move(pp_ranks)),
      actions_(build_schedule(kind, int(pp_ranks_.size()), stage, micro_batches, virtual_stages)),
      pp_(int(pp_ranks_.size())),
      stage_(stage),
      m_(micro_batches),
      v_(virtual_stages),
      pool_(size_t(virtual_stages)),
      tokens_(size_t(model.batch()) * model.config().seq_len),
      targets_(tokens_.size()) {}

GptModel::Activations& PipelineExecutor::acquire(const Key& key) {
  auto it = live_.find(key);
  if (it != live_.end()) return *it->second;
  auto& pool = pool_[size_t(key.second)];
  if (pool.empty()) recycle_sent();
  std::unique_ptr<GptModel::Activations> a;
  if (pool.empty()) {
    a = model_.new_activations(key.second);
  } else {
    a = std::move(pool.back());
    pool.pop_back();
  }
  return *(live_[key] = std::move(a));
}

void PipelineExecutor::release(const Key& key) {
  // A set whose messages may still be leaving waits in `draining_` until the end of
  // the step: waiting for a send here could deadlock (the receiver may post its
  // receive only after its own sends complete).
  auto it = live_.find(key);
  auto s = sends_.find(key);
  if (s != sends_.end()) {
    draining_.push_back({key.second, std::move(it->second), std::move(s->second)});
    sends_.erase(s);
  } else {
    pool_[size_t(key.second)].push_back(std::move(it->second));
  }
  live_.erase(it);
  weight_done_.erase(key);
  gradient_sent_.erase(key);
}

// World rank of the neighbour an action talks to; *peer_chunk gets its chunk.
int PipelineExecutor::peer_for(Op op, int chunk, int* peer_chunk) const {
  const bool towards_next = op == Op::SendForward || op == Op::RecvBackward;
  const int next_stage = towards_next ? (stage_ + 1) % pp_ : (stage_ + pp_ - 1) % pp_;
  *peer_chunk = chunk;
  if (towards_next && stage_ == pp_ - 1) *peer_chunk = chunk + 1;
  if (!towards_next && stage_ == 0) *peer_chunk = chunk - 1;
  return pp_ranks_[size_t(next_stage)];
}

bool PipelineExecutor::is_receive(Op op) { return op == Op::RecvForward || op == Op::RecvBackward; }

// The message of a send or receive action, on the buffers of its activation set.
comm::Transfer PipelineExecutor::transfer(const Action& a) {
  int peer_chunk = 0;
  const int peer = peer_for(a.op, a.chunk, &peer_chunk);
  GptModel::Activations& acts = acquire({a.microbatch, a.chunk});
  const std::size_t bytes = model_.boundary_bytes();
  switch (a.op) {
    case Op::RecvForward:
      return {comm::Transfer::Recv, peer, model_.input_buffer(acts), bytes,
              tag(a.microbatch, a.chunk, false)};
    case Op::RecvBackward:
      return {comm::Transfer::Recv, peer, model_.output_grad(acts), bytes,
              tag(a.microbatch, a.chunk, true)};
    case Op::SendForward:
      return {comm::Transfer::Send, peer, model_.output(acts), bytes,
              tag(a.microbatch, peer_chunk, false)};
    case Op::SendBackward:
      return {comm::Transfer::Send, peer, model_.input_grad(acts), bytes,
              tag(a.microbatch, peer_chunk, true)};
    default:
      throw std::logic_error("transfer: not a send or receive");
  }
}

// Tags name the message by the receiving side's (microbatch, chunk) and direction.
int PipelineExecutor::tag(int microbatch, int chunk, bool backward) const {
  return ((microbatch * v_ + chunk) * 2 + (backward ? 1 : 0)) % 32768;
}

PipelineStats PipelineExecutor::train_step(const BatchFn& batch, float loss_scale,
                                           const ActionFn& on_action,
                                           const std::function<void(int)>& chunk_done) {
  PipelineStats stats;
  const auto start = Clock::now();
  std::vector<int> weights_done(size_t(v_), 0);
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    const Key key{a.microbatch, a.chunk};
    const ChunkSpec& spec = model_.partition().chunks[size_t(a.chunk)];
    const auto t0 = Clock::now();
    bool compute = false;
    const Action* paired = nullptr;  // a receive run in the same batch as this send
    switch (a.op) {
      case Op::RecvForward:
      case Op::RecvBackward:
        world_.exchange({transfer(a)});
        break;
      case Op::Forward: {
        GptModel::Activations& acts = acquire(key);
        if (spec.first || spec.last) batch(a.microbatch, tokens_.data(), targets_.data());
        stats.loss_sum += model_.forward(a.chunk, acts, tokens_.data(), model_.input_buffer(acts),
                                         targets_.data(), loss_scale);
        compute = true;
        break;
      }
      case Op::SendForward:
      case Op::SendBackward: {
        // A send followed by a receive from the same neighbour (1F1B's steady state) goes
        // out as one batch: with NCCL, a lone send on a stream can wait for a receive the
        // peer has queued behind its own send, and both stages would hang.
        const comm::Transfer send = transfer(a);
        int unused = 0;
        if (i + 1 < actions_.size() && is_receive(actions_[i + 1].op) &&
            peer_for(actions_[i + 1].op, actions_[i + 1].chunk, &unused) == send.peer) {
          paired = &actions_[++i];
          world_.exchange({send, transfer(*paired)});
        } else {
          sends_[key].push_back(world_.exchange_start({send}));
        }
        if (a.op == Op::SendBackward) {
          gradient_sent_.insert(key);
          if (weight_done_.count(key)) release(key);  // W already ran
        }
        break;
      }
      case Op::BackwardInput:
        model_.backward_input(a.chunk, acquire(key));
        compute = true;
        break;
      case Op::BackwardWeight:
        model_.backward_weight(a.chunk, acquire(key));
        compute = true;
        // The input gradient may still have to be sent (schedules that run W first).
        weight_done_.insert(key);
        if (spec.first || gradient_sent_.count(key)) release(key);
        if (++weights_done[size_t(a.chunk)] == m_ && chunk_done) chunk_done(a.chunk);
        break;
    }
    // A device backend queues its work: wait for it, so compute time is measured where
    // it is spent (a no-op on the CPU).
    if (compute) model_.backend().synchronize();
    const auto t1 = Clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    (compute ? stats.compute_s : stats.wait_s) += s;
    stats.peak_activations = std::max(stats.peak_activations, int(live_.size() + draining_.size()));
    if (on_action) on_action(a, t0, t1);
    if (on_action && paired) on_action(*paired, t0, t1);
  }
  PPTRAIN_CHECK(live_.empty(), "activations left after the schedule");
  const auto d0 = Clock::now();
  drain();
  stats.wait_s += std::chrono::duration<double>(Clock::now() - d0).count();
  stats.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

double PipelineExecutor::evaluate(int count, const BatchFn& batch, std::vector<float>* losses_out) {
  double loss_sum = 0;
  for (int mb = 0; mb < count; ++mb) {
    for (int c = 0; c < v_; ++c) {  // one micro-batch at a time, through every chunk in turn
      const ChunkSpec& spec = model_.partition().chunks[size_t(c)];
      const Key key{mb, c};
      GptModel::Activations& acts = acquire(key);
      if (!spec.first) world_.exchange({transfer({Op::RecvForward, mb, c})});
      if (spec.first || spec.last) batch(mb, tokens_.data(), targets_.data());
      loss_sum += model_.forward(c, acts, tokens_.data(), model_.input_buffer(acts),
                                 targets_.data(), 0.0f);
      if (spec.last && losses_out) {
        const std::vector<float>& l = model_.position_losses(acts);
        losses_out->insert(losses_out->end(), l.begin(), l.end());
      }
      if (!spec.last) world_.exchange({transfer({Op::SendForward, mb, c})});
      release(key);
    }
  }
  drain();
  return loss_sum;
}

void PipelineExecutor::recycle_sent() {
  // Sets whose messages have all left go back to the pool, so a schedule that holds few
  // sets at once (1F1B) also allocates few.
  for (auto it = draining_.begin(); it != draining_.end();) {
    const bool sent = std::all_of(it->sends.begin(), it->sends.end(),
                                  [](const auto& op) { return op->test(); });
    if (sent) {
      pool_[size_t(it->chunk)].push_back(std::move(it->acts));
      it = draining_.erase(it);
    } else {
      ++it;
    }
  }
}

void PipelineExecutor::drain() {
  for (Draining& d : draining_) {
    for (auto& op : d.sends) op->wait();
    pool_[size_t(d.chunk)].push_back(std::move(d.acts));
  }
  draining_.clear();
}

}  // namespace pptrain
