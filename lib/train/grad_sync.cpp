#include "train/grad_sync.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace pptrain {

namespace {
// Arena range [begin, end) of each chunk's tensors: the layout adds them chunk by chunk
// (a chunk's first entry is its first tensor; the next chunk starts after its last).
std::vector<std::pair<size_t, size_t>> chunk_ranges(const GptModel& model) {
  const auto& entries = model.layout().entries();
  std::vector<size_t> firsts;
  for (const ChunkSpec& c : model.partition().chunks) {
    const std::string name = c.first ? "transformer.wte.weight"
                             : c.layer_end > c.layer_begin
                                 ? "transformer.h." + std::to_string(c.layer_begin) + ".ln_1.weight"
                                 : "transformer.ln_f.weight";
    firsts.push_back(model.layout().at(name).offset);
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t c = 0; c < firsts.size(); ++c)
    ranges.emplace_back(firsts[c], c + 1 < firsts.size() ? firsts[c + 1]
                                                         : entries.back().offset + entries.back().numel);
  return ranges;
}
}  // namespace

GradSync::GradSync(Session& s)
    : s_(s),
      zero_(s.cfg.parallel.zero == 1 && s.grid.dp() > 1),
      total_(s.model.layout().total_floats()),
      shard_(zero_ ? (total_ + size_t(s.grid.dp()) - 1) / size_t(s.grid.dp()) : total_),
      begin_(zero_ ? std::min(total_, size_t(s.coord.dp) * shard_) : 0),
      end_(zero_ ? std::min(total_, begin_ + shard_) : total_),
      chunk_ranges_(chunk_ranges(s.model)) {
  if (s.cfg.parallel.sequence_parallel) {
    std::size_t floats = 0;
    for (const ParamEntry& e : s.model.layout().entries())
      if (e.layer_norm) {
        layer_norms_.push_back(&e);
        floats += e.numel;
      }
    layer_norm_grads_ = ops::Buffer(*s.ops, floats * sizeof(float));
  }
  if (zero_) {
    padded_ = ops::Buffer(*s.ops, shard_ * size_t(s.grid.dp()) * sizeof(float));
    shard_grads_ = ops::Buffer(*s.ops, shard_ * sizeof(float));
  }
  stats_ = ops::Buffer::zeroed(*s.ops, 2 * sizeof(double));
  control_ = ops::Buffer::zeroed(*s.ops, 2 * sizeof(float));
  host_stats_ = {static_cast<double*>(s.ops->allocate_host(2 * sizeof(double))), {s.ops.get()}};
  host_stats_.get()[0] = host_stats_.get()[1] = 0.0;
}

void GradSync::start_step() {
  buckets_.clear();
  stats_.zero();
}

double GradSync::grad_norm() const { return std::sqrt(host_stats_.get()[1]); }

void GradSync::chunk_done(int chunk) {
  if (s_.cfg.parallel.overlap) start_reduction(chunk);
}

void GradSync::start_reduction(int chunk) {
  if (zero_ || s_.grid.dp() == 1) return;
  const auto [b, e] = chunk_ranges_[size_t(chunk)];
  buckets_.push_back(s_.comms.dp_for_model()->all_reduce_start(s_.model.grads() + b, e - b));
}

void GradSync::progress() {
  for (auto& b : buckets_) b->test();
}

void GradSync::finish(double grad_clip) {
  ops::Ops& ops = *s_.ops;
  float* grads = s_.model.grads();
  // Without overlap the reductions start now, one per chunk as with it: the same sums.
  if (!s_.cfg.parallel.overlap)
    for (int c = 0; c < int(chunk_ranges_.size()); ++c) start_reduction(c);
  // Before touching the embedding gradient below; the host goes on.
  for (auto& b : buckets_) b->wait_in_queue();
  buckets_.clear();
  sum_layer_norms_over_tp();
  comm::Group* embedding = s_.comms.embedding_for_model();
  if (embedding && embedding->size() > 1) {
    const ParamEntry& wte = s_.model.layout().at("transformer.wte.weight");
    embedding->all_reduce(grads + wte.offset, wte.numel, comm::ReduceOp::Sum);
  }
  if (zero_) {  // reduce-scatter: this rank ends with the summed gradients of its shard
    float* padded = padded_.f32();
    ops.copy(padded, grads, total_ * sizeof(float));
    ops.fill_zero(padded + total_, (padded_.bytes() / sizeof(float) - total_) * sizeof(float));
    s_.comms.dp_for_model()->reduce_scatter(padded, shard_grads_.f32(), shard_);
    ops.copy(grads + begin_, shard_grads_.get(), (end_ - begin_) * sizeof(float));
  }
  // Each tensor counted once: tp-split shards all, replicated tensors on tp rank 0, the
  // tied copy never; each dp rank its ZeRO shard, or dp rank 0 all when every dp rank
  // holds the same sums. The loss comes from tp rank 0 of the head stage.
  double* stats = static_cast<double*>(stats_.get());
  const bool counts = zero_ || s_.coord.dp == 0;
  ops.sum_squares_to(stats + 1, grad_spans(
                                    s_.model.layout(), grads,
                                    [&](const ParamEntry& e) {
                                      return counts && !e.tied_copy &&
                                             (!e.replicated() || s_.coord.tp == 0);
                                    },
                                    begin_, end_));
  if (!(s_.head_stage() && s_.coord.tp == 0)) ops.fill_zero(stats, sizeof(double));
  s_.comms.tp_for_model()->all_reduce(stats, 2, comm::ReduceOp::Sum);
  s_.comms.pp_for_model()->all_reduce(stats, 2, comm::ReduceOp::Sum);
  s_.comms.dp_for_model()->all_reduce(stats, 2, comm::ReduceOp::Sum);
  ops.update_control(control_.f32(), stats, grad_clip);
  ops.download_async(host_stats_.get(), stats, 2 * sizeof(double));
}

void GradSync::sum_layer_norms_over_tp() {
  if (layer_norms_.empty()) return;
  ops::Ops& ops = *s_.ops;
  float* grads = s_.model.grads();
  float* packed = layer_norm_grads_.f32();
  std::size_t at = 0;
  for (const ParamEntry* e : layer_norms_) {
    ops.copy(packed + at, grads + e->offset, e->numel * sizeof(float));
    at += e->numel;
  }
  s_.comms.tp_for_model()->all_reduce(packed, at, comm::ReduceOp::Sum);
  at = 0;
  for (const ParamEntry* e : layer_norms_) {
    ops.copy(grads + e->offset, packed + at, e->numel * sizeof(float));
    at += e->numel;
  }
}

void GradSync::all_gather_range(const float* shard, float* full) {
  ops::Ops& ops = *s_.ops;
  float* mine = padded_.f32() + size_t(s_.coord.dp) * shard_;
  ops.fill_zero(mine, shard_ * sizeof(float));
  ops.copy(mine, shard, (end_ - begin_) * sizeof(float));
  s_.comms.dp_for_model()->all_gather(mine, padded_.f32(), shard_);
  ops.copy(full, padded_.get(), total_ * sizeof(float));
}

void GradSync::update(AdamW& opt, float lr, int64_t t) {
  GptModel& model = s_.model;
  const float* control = control_.f32();
  if (!zero_) {  // the update writes the weight copy too
    opt.step(model.params(), model.has_weight_copy() ? model.weights() : nullptr, model.grads(),
             lr, 1.0f, t, control);
    return;
  }
  opt.step(model.params(), nullptr, model.grads(), lr, 1.0f, t, control);
  float* params = model.params();
  all_gather_range(params + begin_, params);
  model.refresh_weights();
}

void GradSync::full_moments(AdamW& opt, float* m, float* v) {
  ops::Ops& ops = *s_.ops;
  if (!zero_) {
    ops.download(m, opt.exp_avg(), total_ * sizeof(float));
    ops.download(v, opt.exp_avg_sq(), total_ * sizeof(float));
    return;
  }
  ops::Buffer full(ops, total_ * sizeof(float));
  all_gather_range(opt.exp_avg(), full.f32());
  ops.download(m, full.get(), full.bytes());
  all_gather_range(opt.exp_avg_sq(), full.f32());
  ops.download(v, full.get(), full.bytes());
}

void GradSync::load_moments(const float* m, const float* v, AdamW& opt) {
  s_.ops->upload(opt.exp_avg(), m + begin_, (end_ - begin_) * sizeof(float));
  s_.ops->upload(opt.exp_avg_sq(), v + begin_, (end_ - begin_) * sizeof(float));
}

}  // namespace pptrain
