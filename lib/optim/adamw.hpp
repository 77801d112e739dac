// AdamW over the flat parameter arena, plus global gradient-norm clipping helpers.
// Moments are fp32 arenas laid out by the same ParamLayout as parameters and grads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "config/config.hpp"
#include "core/aligned_buffer.hpp"
#include "model/param_layout.hpp"

namespace pptrain {

// AdamW with decoupled weight decay (PyTorch semantics): for each element,
// g = grad*grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
// p -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd*p ), wd = weight_decay only for
// entries with decay=true (0 for biases and LayerNorm). t is the 1-based update count.
// Elements in alignment gaps between entries are never touched.
class AdamW {
 public:
  // Updates the arena elements in [begin, end) only (ZeRO-1: this rank's shard); the
  // default is the whole arena.
  AdamW(const ParamLayout& layout, const TrainConfig& train, std::size_t begin = 0,
        std::size_t end = SIZE_MAX);

  // One update of every entry in range; params and grads are arenas of
  // layout.total_floats() (only [begin, end) is read or written).
  void step(float* params, const float* grads, float lr, float grad_scale, int64_t t);

  // First and second moments of elements [begin, end): arena element i is moment
  // i - begin (zero at construction).
  float* exp_avg() { return m_.data(); }
  float* exp_avg_sq() { return v_.data(); }
  const float* exp_avg() const { return m_.data(); }
  const float* exp_avg_sq() const { return v_.data(); }

 private:
  ParamLayout layout_;
  double beta1_, beta2_, eps_, weight_decay_;
  std::size_t begin_, end_;
  AlignedBuffer<float> m_, v_;
};

// Global L2 norm of all gradient entries (fp64 accumulation, fixed order).
double grad_norm(const ParamLayout& layout, const float* grads);
// Sum of squares of the gradient entries for which `counted` is true (fp64, fixed order):
// a rank's share of a global norm.
double grad_square_sum(const ParamLayout& layout, const float* grads,
                       const std::function<bool(const ParamEntry&)>& counted,
                       std::size_t begin = 0, std::size_t end = SIZE_MAX);

// Clipping multiplier: grad_clip > 0 and norm > grad_clip -> grad_clip / (norm + 1e-6); else 1.
float clip_scale(double norm, double grad_clip);

}  // namespace pptrain
