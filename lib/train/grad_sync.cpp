#include "train/grad_sync.hpp"

#include <algorithm>
#include <cstddef>
#include <cmath>

#include "core/error.hpp"

namespace pptrain {

GradSync::GradSync(Session& s)
    : s_(s),
      zero_(zero_shards(s.cfg.parallel)),
      overlap_(s.cfg.parallel.overlap),
      dp_(s.grid.replicas()),
      buckets_(plan_grad_buckets(s.model.layout(), s.model.partition(),
                                 bucket_floats(s.cfg.parallel))),
      pending_(buckets_.size()) {
  const ParamLayout& layout = s.model.layout();
  const std::size_t total = layout.total_floats();
  comm::Group* embedding = s.comms.embedding_for_model();
  const std::string& wte_name = embedding_name(s.cfg.model.arch);
  const bool tied = embedding && embedding->size() > 1 && layout.contains(wte_name);
  for (const GradBucket& b : buckets_) {
    bool holds_wte = false;
    if (tied) {
      const ParamEntry& wte = layout.at(wte_name);
      holds_wte = wte.offset < b.end && b.begin < wte.offset + wte.numel;
    }
    after_embedding_.push_back(zero_ && holds_wte);
    const std::size_t block = b.size() / std::size_t(dp_);
    const std::size_t at = b.begin + std::size_t(s.grid.replica(s.rank)) * block;
    if (zero_) owned_.emplace_back(at, at + block);
  }
  if (!zero_) owned_ = {{0, total}};
  if (s.cfg.parallel.sequence_parallel) {
    std::size_t floats = 0;
    for (const ParamEntry& e : layout.entries())
      for (const auto& [b, end] : owned_)
        if (e.layer_norm && std::max(b, e.offset) < std::min(end, e.offset + e.numel)) {
          layer_norms_.emplace_back(std::max(b, e.offset), std::min(end, e.offset + e.numel));
          floats += layer_norms_.back().second - layer_norms_.back().first;
        }
    layer_norm_grads_ = ops::Buffer(*s.ops, floats * sizeof(float), "the packed LayerNorm gradients");
  }
  stats_ = ops::Buffer::zeroed(*s.ops, 2 * sizeof(double));
  control_ = ops::Buffer::zeroed(*s.ops, 2 * sizeof(float));
  host_stats_ = {static_cast<double*>(s.ops->allocate_host(2 * sizeof(double))), {s.ops.get()}};
  host_stats_.get()[0] = host_stats_.get()[1] = 0.0;
}

double GradSync::grad_norm() const { return std::sqrt(host_stats_.get()[1]); }

PipelineExecutor::GradHooks GradSync::hooks() {
  PipelineExecutor::GradHooks h;
  if (overlap_ && dp_ > 1) {
    h.layer_done = [this](int layer) { layer_done(layer); };
    h.chunk_done = [this](int chunk) { chunk_done(chunk); };
    h.progress = [this] { progress(); };
  }
  return h;
}

void GradSync::layer_done(int layer) {
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].layer == layer && !after_embedding_[i]) start(i);
}

void GradSync::chunk_done(int chunk) {
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].chunk == chunk && !after_embedding_[i]) start(i);
}

void GradSync::start(std::size_t i) {
  if (dp_ == 1 || pending_[i]) return;
  comm::Group& dp = *s_.comms.dp_for_model();
  float* data = s_.model.grads() + buckets_[i].begin;
  pending_[i] = zero_ ? dp.reduce_scatter_start(data, buckets_[i].size())
                      : dp.all_reduce_start(data, buckets_[i].size());
}

void GradSync::progress() {
  for (auto& p : pending_)
    if (p) p->test();
}

void GradSync::wait_started() {
  for (auto& p : pending_)
    if (p) p->wait_in_queue();
}

void GradSync::finish(double grad_clip) {
  ops::Ops& ops = *s_.ops;
  float* grads = s_.model.grads();
  // Without overlap every reduction starts now, in bucket order: the same sums.
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    if (!after_embedding_[i]) start(i);
  wait_started();  // before touching the embedding gradient below; the host goes on
  comm::Group* embedding = s_.comms.embedding_for_model();
  if (embedding && embedding->size() > 1) {
    const ParamEntry& wte = s_.model.layout().at(embedding_name(s_.cfg.model.arch));
    embedding->all_reduce(grads + wte.offset, wte.numel, comm::ReduceOp::Sum);
  }
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    if (after_embedding_[i]) start(i);
  wait_started();
  sum_layer_norms_over_tp();
  // Each tensor counted once: tp-split shards all, replicated tensors on tp rank 0, the
  // tied copy never; each dp rank its ZeRO blocks, or dp rank 0 all when every dp rank
  // holds the same sums. The loss comes from tp rank 0 of the head stage.
  double* stats = static_cast<double*>(stats_.get());
  const bool counts = zero_ || s_.grid.replica(s_.rank) == 0;
  std::vector<ops::Span> spans;
  for (const auto& [b, e] : owned_) {
    const auto part = grad_spans(
        s_.model.layout(), grads,
        [&](const ParamEntry& p) { return counts && !p.tied_copy && (!p.replicated() || s_.coord.tp == 0); },
        b, e);
    spans.insert(spans.end(), part.begin(), part.end());
  }
  ops.sum_squares_to(stats + 1, spans);
  if (!(s_.head_stage() && s_.coord.tp == 0)) ops.fill_zero(stats, sizeof(double));
  s_.comms.tp_for_model()->all_reduce(stats, 2, comm::ReduceOp::Sum);
  s_.comms.pp_for_model()->all_reduce(stats, 2, comm::ReduceOp::Sum);
  s_.comms.dp_for_model()->all_reduce(stats, 2, comm::ReduceOp::Sum);
  ops.update_control(control_.f32(), stats, grad_clip);
  ops.download_async(host_stats_.get(), stats, 2 * sizeof(double));
  stats_.zero();  // queued after the copy: the next step's sums start from 0
  for (auto& p : pending_) p.reset();  // every reduction is waited for in the queue
}

void GradSync::sum_layer_norms_over_tp() {
  if (layer_norms_.empty()) return;
  ops::Ops& ops = *s_.ops;
  float* grads = s_.model.grads();
  float* packed = layer_norm_grads_.f32();
  std::size_t at = 0;
  for (const auto& [b, e] : layer_norms_) {
    ops.copy(packed + at, grads + b, (e - b) * sizeof(float));
    at += e - b;
  }
  s_.comms.tp_for_model()->all_reduce(packed, at, comm::ReduceOp::Sum);
  at = 0;
  for (const auto& [b, e] : layer_norms_) {
    ops.copy(grads + b, packed + at, (e - b) * sizeof(float));
    at += e - b;
  }
}

void GradSync::update(AdamW& opt, float lr, int64_t t) {
  Model& model = s_.model;
  const float* control = control_.f32();
  float* params = model.params();  // null when the optimizer holds the master
  ops::Act* copy = model.has_weight_copy() ? model.weights() : nullptr;
  if (!zero_) {  // the update writes the weight copy too
    opt.step(params, copy, model.grads(), lr, 1.0f, t, control);
    return;
  }
  // Each bucket's block, then (with overlap) its all-gather beside the next block's update.
  // With a weight copy (bf16 on a GPU) the update writes the block's copy too and only the
  // copy is gathered, 2 bytes a parameter: the master is the optimizer's, sharded.
  void* gathered = copy ? static_cast<void*>(copy) : params;
  const DType dt = copy ? model.backend().compute_dtype() : DType::F32;
  std::vector<std::unique_ptr<comm::PendingOp>> gathers;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    opt.step_range(i, params, copy, model.grads(), lr, 1.0f, t, control);
    if (!overlap_) continue;
    gathers.push_back(gather_block(i, gathered, dt));
    gathers.back()->test();  // MPI progresses every started request here
  }
  for (auto& g : gathers) g->wait_in_queue();
  if (!overlap_) all_gather_blocks(gathered, dt);
}

ops::Span GradSync::master(AdamW& opt) {
  if (float* params = s_.model.params()) return {params, s_.model.layout().total_floats()};
  return {opt.master(), opt.size()};
}

void GradSync::read_params(AdamW& opt, float* host) {
  if (s_.model.params())
    s_.model.read_params(host);
  else
    download_whole(opt, opt.master(), host);
}

void GradSync::write_params(AdamW& opt, const float* host) {
  s_.model.write_params(host);
  if (opt.master()) opt.upload_ranges(opt.master(), host);
}

std::unique_ptr<comm::PendingOp> GradSync::gather_block(std::size_t i, void* arena, DType dt) {
  const GradBucket& b = buckets_[i];
  return s_.comms.dp_for_model()->all_gather_start(
      static_cast<std::byte*>(arena) + b.begin * dtype_size(dt), b.size(), dt);
}

void GradSync::all_gather_blocks(void* arena, DType dt) {
  std::vector<std::unique_ptr<comm::PendingOp>> gathers;
  for (std::size_t i = 0; i < buckets_.size(); ++i) gathers.push_back(gather_block(i, arena, dt));
  for (auto& g : gathers) g->wait_in_queue();
}

void GradSync::download_whole(AdamW& opt, const float* packed, float* host) {
  ops::Ops& ops = *s_.ops;
  PPTRAIN_CHECK(zero_, "download_whole: the blocks are gathered over dp under ZeRO-1 only");
  std::size_t largest = 0;
  for (const GradBucket& b : buckets_) largest = std::max(largest, b.size());
  ops::Buffer whole(ops, largest * sizeof(float), "a bucket gathered for a checkpoint");
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const GradBucket& b = buckets_[i];
    const std::size_t block = b.size() / std::size_t(dp_);
    ops.copy(whole.f32() + std::size_t(s_.grid.replica(s_.rank)) * block, packed + opt.moment_offset(i),
             block * sizeof(float));
    s_.comms.dp_for_model()->all_gather_start(whole.get(), b.size(), DType::F32)->wait_in_queue();
    ops.download(host + b.begin, whole.get(), b.size() * sizeof(float));
  }
}

void GradSync::load_moments(const float* m, const float* v, AdamW& opt) {
  opt.upload_ranges(opt.exp_avg(), m);
  opt.upload_ranges(opt.exp_avg_sq(), v);
}

}  // namespace pptrain
