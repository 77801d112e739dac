// Checks a backend's AdamW update against the same update in double precision, element
// by element, with a bound from a forward error analysis of the fp32 operations
// (adamw_check.cpp). The reference starts from the backend's own state and gradients,
// so the check measures the update alone: a different rounding of the gradients (another
// GEMM, another machine) changes both sides alike, while a wrong formula (a missing bias
// correction, swapped betas, decay on the wrong entries) is many bounds away.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/config.hpp"
#include "model/param_layout.hpp"
#include "ops/ops.hpp"

namespace pptrain::test_support {

// One update as the caller asks for it: the hyperparameters in double, as the config
// holds them (the reference never sees the fp32 constants a kernel is handed), lr and
// grad_scale as the fp32 values the optimizer is given.
struct AdamWSpec {
  double lr, beta1, beta2, eps, weight_decay, grad_scale;
  int64_t t;  // 1-based update count
};

// Host copies of an optimizer's arrays over the same n elements.
struct AdamWState {
  std::vector<float> params, exp_avg, exp_avg_sq;
};

// The fp32 constants a correct optimizer hands its kernel for `spec` (each the double
// value rounded once).
ops::AdamWStep adamw_step_constants(const AdamWSpec& spec);

// Elements [begin, end) of `after` (params and both moments) are each within their
// bound of the double-precision update of `before` with `grads` under `spec`. When
// worst is not null it receives the largest error / bound ratio seen.
::testing::AssertionResult adamw_update_within_bound(const AdamWState& before,
                                                     const std::vector<float>& grads,
                                                     const AdamWState& after,
                                                     const AdamWSpec& spec, std::size_t begin,
                                                     std::size_t end, double* worst = nullptr);

// The same over an AdamW's whole arena: weight decay on the entries that take it, as
// pptrain::AdamW applies it, and every element between entries unchanged.
::testing::AssertionResult adamw_layout_update_within_bound(
    const ParamLayout& layout, const TrainConfig& train, float lr, float grad_scale, int64_t t,
    const AdamWState& before, const std::vector<float>& grads, const AdamWState& after,
    double* worst = nullptr);

// Host copies of a whole-arena optimizer's state: params from backend memory
// (layout-sized) and the moments (the same size).
AdamWState download_adamw_state(ops::Ops& ops, const float* params, const float* exp_avg,
                                const float* exp_avg_sq, std::size_t n);

}  // namespace pptrain::test_support
