// AdamW update and gradient-norm helpers. Each element's update depends only on its
// own values, and the norm is summed in a fixed order, so results are deterministic.
#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"

namespace pptrain {

namespace {
std::vector<AdamW::Range> clamped(std::vector<AdamW::Range> ranges, std::size_t total) {
  for (auto& [b, e] : ranges) {
    e = std::min(e, total);
    b = std::min(b, e);
  }
  return ranges;
}
std::vector<std::size_t> prefix_sizes(const std::vector<AdamW::Range>& ranges) {
  std::vector<std::size_t> at{0};
  for (const auto& [b, e] : ranges) at.push_back(at.back() + (e - b));
  return at;
}
}  // namespace

bool zero_shards(const ParallelConfig& p) { return p.zero == 1 && replicas(p) > 1; }

bool optimizer_holds_master(const ParallelConfig& p, DType compute) {
  return zero_shards(p) && compute != DType::F32;
}

AdamW::AdamW(ops::Ops& ops, const ParamLayout& layout, const TrainConfig& train,
             std::vector<Range> ranges, bool holds_master)
    : ops_(ops),
      layout_(layout),
      beta1_(train.beta1),
      beta2_(train.beta2),
      eps_(train.eps),
      weight_decay_(train.weight_decay),
      ranges_(clamped(std::move(ranges), layout.total_floats())),
      offsets_(prefix_sizes(ranges_)),
      m_(ops::Buffer::zeroed(ops, size() * sizeof(float), "the optimizer's first moments")),
      v_(ops::Buffer::zeroed(ops, size() * sizeof(float), "the optimizer's second moments")) {
  if (holds_master) master_ = ops::Buffer(ops, size() * sizeof(float), "the optimizer's master weights");
  schedule_ = ops::Buffer(ops, 3 * sizeof(float), "the optimizer's step schedule");
  staged_schedule_ = {static_cast<float*>(ops.allocate_host(3 * sizeof(float))), {&ops}};
}

void AdamW::stage_schedule(float lr, int64_t t) {
  PPTRAIN_CHECK(t >= 1, "AdamW update count t is 1-based");
  // The bias corrections once per step, in double, then used as fp32 factors.
  float* s = staged_schedule_.get();
  s[0] = lr;
  s[1] = float(1.0 / (1.0 - std::pow(beta1_, double(t))));
  s[2] = float(1.0 / (1.0 - std::pow(beta2_, double(t))));
}

void AdamW::upload_ranges(float* packed, const float* host_arena) {
  for (std::size_t i = 0; i < ranges_.size(); ++i)
    ops_.upload(packed + offsets_[i], host_arena + ranges_[i].first,
                (ranges_[i].second - ranges_[i].first) * sizeof(float));
}

void AdamW::step(float* params, ops::Act* weights, const float* grads, float lr,
                 float grad_scale, int64_t t, const float* control) {
  std::vector<ops::AdamWSegment> segments;
  for (std::size_t i = 0; i < ranges_.size(); ++i) add_segments(i, segments);
  update(segments, params, weights, grads, lr, grad_scale, t, control);
}

void AdamW::step_range(std::size_t i, float* params, ops::Act* weights, const float* grads,
                       float lr, float grad_scale, int64_t t, const float* control) {
  std::vector<ops::AdamWSegment> segments;
  add_segments(i, segments);
  update(segments, params, weights, grads, lr, grad_scale, t, control);
}

// The entries' parts inside range i, each with its weight decay: the arena index, the
// parameter index (the arena's, or the optimizer's master packed as the moments are)
// and the moments' index.
void AdamW::add_segments(std::size_t i, std::vector<ops::AdamWSegment>& segments) const {
  const auto [begin, end] = ranges_[i];
  for (const ParamEntry& e : layout_.entries()) {
    const std::size_t lo = std::max(e.offset, begin), hi = std::min(e.offset + e.numel, end);
    if (lo >= hi) continue;
    const std::size_t state = offsets_[i] + (lo - begin);
    segments.push_back({lo, master_.get() ? state : lo, state, hi - lo,
                        e.decay ? float(weight_decay_) : 0.0f});
  }
}

void AdamW::update(const std::vector<ops::AdamWSegment>& segments, float* params,
                   ops::Act* weights, const float* grads, float lr, float grad_scale, int64_t t,
                   const float* control) {
  PPTRAIN_CHECK((params == nullptr) == (master_.get() != nullptr),
                "AdamW: parameters come from the caller or from the optimizer's master, not both");
  stage_schedule(lr, t);
  ops_.upload(schedule_.get(), staged_schedule_.get(), 3 * sizeof(float));
  // 1 - beta in double, then rounded once.
  ops::AdamWStep h{};
  h.lr = lr;
  h.beta1 = float(beta1_);
  h.beta2 = float(beta2_);
  h.one_minus_beta1 = float(1.0 - beta1_);
  h.one_minus_beta2 = float(1.0 - beta2_);
  h.eps = float(eps_);
  h.inv_bias_correction1 = staged_schedule_.get()[1];
  h.inv_bias_correction2 = staged_schedule_.get()[2];
  h.grad_scale = grad_scale;
  h.control = control;
  h.schedule = schedule_.f32();
  ops_.adamw_segments(master_.get() ? master_.f32() : params, weights, grads, m_.f32(), v_.f32(),
                      segments, h);
}

std::vector<ops::Span> grad_spans(const ParamLayout& layout, const float* grads,
                                  const std::function<bool(const ParamEntry&)>& counted,
                                  std::size_t begin, std::size_t end) {
  std::vector<ops::Span> spans;
  for (const ParamEntry& e : layout.entries()) {
    if (!counted(e)) continue;
    const std::size_t lo = std::max(e.offset, begin), hi = std::min(e.offset + e.numel, end);
    if (lo < hi) spans.push_back({grads + lo, hi - lo});
  }
  return spans;
}

double grad_square_sum(ops::Ops& ops, const ParamLayout& layout, const float* grads,
                       const std::function<bool(const ParamEntry&)>& counted, std::size_t begin,
                       std::size_t end) {
  return ops.sum_squares(grad_spans(layout, grads, counted, begin, end));
}

}  // namespace pptrain
