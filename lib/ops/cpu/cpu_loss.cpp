// CPU backend: softmax cross-entropy over the first V of Vp logit columns.
#include <cmath>

#include "core/error.hpp"
#include "ops/cpu/cpu_math.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

void CpuOps::cross_entropy(float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int N, int V, int Vp, float dloss) {
  PPTRAIN_CHECK(V > 0 && V <= Vp, "cross_entropy: need 0 < V <= Vp");
  // exp(x - max) goes to dlogits (later scaled to probabilities) or, for the loss
  // alone, to a scratch row: one exp per column either way.
  float* scratch = dlogits == nullptr ? float_scratch(static_cast<std::size_t>(V)) : nullptr;
  for (int n = 0; n < N; ++n) {
    const std::size_t off = static_cast<std::size_t>(n) * Vp;
    const float* x = logits + off;
    const int32_t target = targets[n];
    PPTRAIN_CHECK(target >= 0 && target < V, "cross_entropy: target outside [0, V)");
    const float maxv = cpu::row_max(x, V);
    // Read the target logit now: dlogits may alias logits and is overwritten below.
    const double shifted_target = static_cast<double>(x[target]) - maxv;
    float* e = dlogits != nullptr ? dlogits + off : scratch;
    for (int j = 0; j < V; ++j) e[j] = cpu::exp_nonpositive(x[j] - maxv);
    const double sum = cpu::row_sum(e, V);
    losses[n] = static_cast<float>(std::log(sum) - shifted_target);
    if (dlogits == nullptr) continue;
    // dlogits = dloss * (p - onehot(target)), zero on the padded columns.
    const float scale = static_cast<float>(dloss / sum);
    for (int j = 0; j < V; ++j) e[j] *= scale;
    e[target] -= dloss;
    for (int j = V; j < Vp; ++j) e[j] = 0.0f;
  }
}

}  // namespace pptrain::ops
