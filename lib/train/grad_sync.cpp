#include "train/grad_sync.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

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
  if (zero_) {
    padded_.resize(shard_ * size_t(s.grid.dp()));
    shard_grads_.resize(shard_);
  }
}

void GradSync::chunk_done(int chunk) {
  if (zero_ || s_.grid.dp() == 1) return;
  const auto [b, e] = chunk_ranges_[size_t(chunk)];
  buckets_.push_back(s_.comms.dp->all_reduce_start(s_.model.grads() + b, e - b));
}

double GradSync::finish() {
  float* grads = s_.model.grads();
  for (auto& b : buckets_) b->wait();  // before touching the embedding gradient below
  buckets_.clear();
  if (s_.comms.embedding && s_.comms.embedding->size() > 1) {
    const ParamEntry& wte = s_.model.layout().at("transformer.wte.weight");
    s_.comms.embedding->all_reduce(grads + wte.offset, wte.numel, comm::ReduceOp::Sum);
  }
  if (zero_) {  // reduce-scatter: this rank ends with the summed gradients of its shard
    std::copy(grads, grads + total_, padded_.begin());
    std::fill(padded_.begin() + long(total_), padded_.end(), 0.0f);
    s_.comms.dp->reduce_scatter(padded_.data(), shard_grads_.data(), shard_);
    std::copy(shard_grads_.begin(), shard_grads_.begin() + long(end_ - begin_), grads + begin_);
  }
  // Each tensor counted once: tp-split shards all, replicated tensors on tp rank 0, the
  // tied copy never; under ZeRO each dp rank adds its shard.
  double sq = grad_square_sum(
      s_.model.layout(), grads,
      [&](const ParamEntry& e) { return !e.tied_copy && (!e.replicated() || s_.coord.tp == 0); },
      begin_, end_);
  s_.comms.tp->all_reduce(&sq, 1, comm::ReduceOp::Sum);
  s_.comms.pp->all_reduce(&sq, 1, comm::ReduceOp::Sum);
  if (zero_) s_.comms.dp->all_reduce(&sq, 1, comm::ReduceOp::Sum);
  return std::sqrt(sq);
}

void GradSync::all_gather_range(const float* shard, float* full) {
  float* mine = padded_.data() + size_t(s_.coord.dp) * shard_;
  std::fill(mine, mine + shard_, 0.0f);
  std::copy(shard, shard + (end_ - begin_), mine);
  s_.comms.dp->all_gather(mine, padded_.data(), shard_);
  std::copy(padded_.begin(), padded_.begin() + long(total_), full);
}

void GradSync::share_parameters() {
  if (!zero_) return;
  float* params = s_.model.params();
  all_gather_range(params + begin_, params);
}

void GradSync::full_moments(const AdamW& opt, float* m, float* v) {
  if (!zero_) {
    std::memcpy(m, opt.exp_avg(), total_ * sizeof(float));
    std::memcpy(v, opt.exp_avg_sq(), total_ * sizeof(float));
    return;
  }
  all_gather_range(opt.exp_avg(), m);
  all_gather_range(opt.exp_avg_sq(), v);
}

void GradSync::load_moments(const float* m, const float* v, AdamW& opt) {
  std::copy(m + begin_, m + end_, opt.exp_avg());
  std::copy(v + begin_, v + end_, opt.exp_avg_sq());
}

}  // namespace pptrain
