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
}

void GradSync::chunk_done(int chunk) {
  if (zero_ || s_.grid.dp() == 1) return;
  const auto [b, e] = chunk_ranges_[size_t(chunk)];
  buckets_.push_back(s_.comms.dp_for_model()->all_reduce_start(s_.model.grads() + b, e - b));
}

double GradSync::finish() {
  ops::Ops& ops = *s_.ops;
  float* grads = s_.model.grads();
  for (auto& b : buckets_) b->wait();  // before touching the embedding gradient below
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
  // tied copy never; under ZeRO each dp rank adds its shard.
  double sq = grad_square_sum(
      ops, s_.model.layout(), grads,
      [&](const ParamEntry& e) { return !e.tied_copy && (!e.replicated() || s_.coord.tp == 0); },
      begin_, end_);
  s_.comms.tp->all_reduce(&sq, 1, comm::ReduceOp::Sum);
  s_.comms.pp->all_reduce(&sq, 1, comm::ReduceOp::Sum);
  if (zero_) s_.comms.dp->all_reduce(&sq, 1, comm::ReduceOp::Sum);
  return std::sqrt(sq);
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

void GradSync::update(AdamW& opt, float lr, float grad_scale, int64_t t) {
  GptModel& model = s_.model;
  if (!zero_) {  // the update writes the weight copy too
    opt.step(model.params(), model.has_weight_copy() ? model.weights() : nullptr, model.grads(),
             lr, grad_scale, t);
    return;
  }
  opt.step(model.params(), nullptr, model.grads(), lr, grad_scale, t);
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
