// AdamW update and gradient-norm helpers. Each element's update depends only on its
// own values, and the norm is summed in a fixed order, so results are deterministic.
#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace pptrain {

AdamW::AdamW(const ParamLayout& layout, const TrainConfig& train, std::size_t begin,
             std::size_t end)
    : layout_(layout),
      beta1_(train.beta1),
      beta2_(train.beta2),
      eps_(train.eps),
      weight_decay_(train.weight_decay),
      begin_(std::min(begin, layout.total_floats())),
      end_(std::min(end, layout.total_floats())),
      m_(end_ > begin_ ? end_ - begin_ : 0),
      v_(end_ > begin_ ? end_ - begin_ : 0) {}

void AdamW::step(float* params, const float* grads, float lr, float grad_scale, int64_t t) {
  PPTRAIN_CHECK(t >= 1, "AdamW update count t is 1-based");
  // Bias corrections once per step, in double, then used as fp32 factors.
  const float inv_bc1 = float(1.0 / (1.0 - std::pow(beta1_, double(t))));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(beta2_, double(t))));
  const float b1 = float(beta1_), b2 = float(beta2_);
  const float one_minus_b1 = float(1.0 - beta1_), one_minus_b2 = float(1.0 - beta2_);
  const float eps = float(eps_);

  for (const ParamEntry& e : layout_.entries()) {
    // The part of the entry inside this optimizer's range.
    const std::size_t lo = std::max(e.offset, begin_), hi = std::min(e.offset + e.numel, end_);
    if (lo >= hi) continue;
    const float wd = e.decay ? float(weight_decay_) : 0.0f;
    float* p = params + lo;
    const float* g_in = grads + lo;
    float* m = m_.data() + (lo - begin_);
    float* v = v_.data() + (lo - begin_);
    for (std::size_t i = 0; i < hi - lo; ++i) {
      const float g = g_in[i] * grad_scale;
      m[i] = b1 * m[i] + one_minus_b1 * g;
      v[i] = b2 * v[i] + one_minus_b2 * (g * g);
      const float m_hat = m[i] * inv_bc1;
      const float v_hat = v[i] * inv_bc2;
      p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p[i]);
    }
  }
}

double grad_norm(const ParamLayout& layout, const float* grads) {
  return std::sqrt(grad_square_sum(layout, grads, [](const ParamEntry&) { return true; }));
}

double grad_square_sum(const ParamLayout& layout, const float* grads,
                       const std::function<bool(const ParamEntry&)>& counted, std::size_t begin,
                       std::size_t end) {
  // Eight interleaved partial sums per entry (a fixed pattern, so still deterministic)
  // keep the fp64 adds from forming one long dependency chain.
  constexpr std::size_t kLanes = 8;
  double total = 0.0;
  for (const ParamEntry& e : layout.entries()) {
    if (!counted(e)) continue;
    const std::size_t lo = std::max(e.offset, begin), hi = std::min(e.offset + e.numel, end);
    if (lo >= hi) continue;
    const float* g = grads + lo;
    const std::size_t numel = hi - lo;
    double part[kLanes] = {};
    std::size_t i = 0;
    for (; i + kLanes <= numel; i += kLanes)
      for (std::size_t k = 0; k < kLanes; ++k) part[k] += double(g[i + k]) * double(g[i + k]);
    for (std::size_t k = 0; i < numel; ++i, ++k) part[k] += double(g[i]) * double(g[i]);
    double sum = 0.0;
    for (double s : part) sum += s;
    total += sum;
  }
  return total;
}

float clip_scale(double norm, double grad_clip) {
  if (grad_clip > 0.0 && norm > grad_clip) return float(grad_clip / (norm + 1e-6));
  return 1.0f;
}

}  // namespace pptrain
