// AdamW over the flat parameter arena, plus the gradient-norm helpers.
// Moments are fp32 arenas laid out by the same ParamLayout as parameters and grads, in
// the backend's memory; the arithmetic is the backend's (ops::Ops::adamw, sum_squares).
// Under ZeRO-1 the optimizer holds only its ranges: the moments and, with a weight copy,
// the fp32 master weights too (Megatron-Core's distributed optimizer).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "model/param_layout.hpp"
#include "ops/ops.hpp"

namespace pptrain {

// AdamW with decoupled weight decay (PyTorch semantics): for each element,
// g = grad*grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
// p -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd*p ), wd = weight_decay only for
// entries with decay=true (0 for biases and LayerNorm). t is the 1-based update count.
// Elements in alignment gaps between entries are never touched.
// ZeRO-1: parallel.zero: 1 with more than one data-parallel rank shards the optimizer.
bool zero_shards(const ParallelConfig& p);
// Whether the fp32 master weights are optimizer state, sharded with the moments: under
// ZeRO-1 when the model computes with a weight copy (compute dtype not fp32). Otherwise
// the model's own parameter arena is the master.
bool optimizer_holds_master(const ParallelConfig& p, DType compute);

class AdamW {
 public:
  using Range = std::pair<std::size_t, std::size_t>;  // arena floats [first, second)
  // Updates the arena elements in `ranges` only (ZeRO-1: this rank's blocks of every
  // gradient bucket); the default is the whole arena. With `holds_master` it keeps the
  // ranges' fp32 master weights itself (master()).
  AdamW(ops::Ops& ops, const ParamLayout& layout, const TrainConfig& train,
        std::vector<Range> ranges = {{0, SIZE_MAX}}, bool holds_master = false);

  // One update of every entry in range, in one multi-tensor pass; params and grads are
  // arenas of layout.total_floats() in backend memory (only the ranges are read or written);
  // params is null when the optimizer holds the master. When `weights` is not null the
  // updated elements are also written there in the backend's compute dtype (the model's
  // weight copy). `control` (backend memory; may be null): ops::AdamWStep::control,
  // which replaces grad_scale and may skip the update.
  void step(float* params, ops::Act* weights, const float* grads, float lr, float grad_scale,
            int64_t t, const float* control = nullptr);
  // The same for range i alone: step() is step_range over every range.
  void step_range(std::size_t i, float* params, ops::Act* weights, const float* grads, float lr,
                  float grad_scale, int64_t t, const float* control = nullptr);
  // The updates read lr and the bias corrections of step t from backend memory, copied
  // there (in the queue) from host memory this writes: a replay of a captured update
  // (Ops::replay) needs only this, not step().
  void stage_schedule(float lr, int64_t t);

  // First and second moments of the ranges' elements in backend memory, range after
  // range: range i's element x is moment moment_offset(i) + x - ranges()[i].first.
  float* exp_avg() { return m_.f32(); }
  float* exp_avg_sq() { return v_.f32(); }
  // The ranges' fp32 master weights, packed the same way; null unless holds_master.
  float* master() { return master_.f32(); }
  // Copies the ranges of a whole arena in host memory into `packed` (one of the three
  // above), range after range.
  void upload_ranges(float* packed, const float* host_arena);
  const std::vector<Range>& ranges() const { return ranges_; }
  std::size_t moment_offset(std::size_t i) const { return offsets_[i]; }
  std::size_t size() const { return offsets_.back(); }

 private:
  void add_segments(std::size_t i, std::vector<ops::AdamWSegment>& segments) const;
  void update(const std::vector<ops::AdamWSegment>& segments, float* params, ops::Act* weights,
              const float* grads, float lr, float grad_scale, int64_t t, const float* control);

  ops::Ops& ops_;
  ParamLayout layout_;
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Range> ranges_;
  std::vector<std::size_t> offsets_;  // prefix sums of the range sizes
  ops::Buffer m_, v_, master_;
  ops::Buffer schedule_;                                      // {lr, 1/(1-b1^t), 1/(1-b2^t)}
  std::unique_ptr<float, ops::Ops::FreeHost> staged_schedule_;  // its host copy (pinned on CUDA)
};

// The parts in [begin, end) of the gradient entries for which `counted` is true, in
// layout order: a rank's share of a global norm. grads is in backend memory.
std::vector<ops::Span> grad_spans(const ParamLayout& layout, const float* grads,
                                  const std::function<bool(const ParamEntry&)>& counted,
                                  std::size_t begin = 0, std::size_t end = SIZE_MAX);
// Their sum of squares (fp64, fixed order).
double grad_square_sum(ops::Ops& ops, const ParamLayout& layout, const float* grads,
                       const std::function<bool(const ParamEntry&)>& counted,
                       std::size_t begin = 0, std::size_t end = SIZE_MAX);

}  // namespace pptrain
