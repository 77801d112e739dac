// One training step of a whole GPT on one backend, kept for comparing backends: the
// loss, a host copy of the gradients, and the AdamW update checked against its
// double-precision reference (tests/optim/adamw_check.hpp). Also the gradient
// comparison between two backends and its bounds.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

#include "adamw_check.hpp"
#include "model/gpt.hpp"
#include "optim/adamw.hpp"

namespace pptrain::test_support {

// Normwise bounds on gradients of one model at one point, computed by two backends
// whose sums round differently (a double-accumulating GEMM against OpenBLAS's fp32
// kernels, or one OpenBLAS kernel family against another): max |a - b| over a tensor,
// over max |b| of that tensor. Elements far below their tensor's largest are
// differences of larger terms, and their own relative error says nothing of the code;
// the normwise measure weighs them by their tensor.
// fp32: on the longest path from the loss to a layer-0 weight gradient of the model
// these tests run (2 layers, d_model 64, 128 tokens, vocabulary padded to 128) about
// n = 4000 products are summed (K = 16 to 256 per sum, about 50 sums). Independent
// roundings (u = 2^-24) add like a random walk: the probabilistic bound lambda sqrt(n) u
// (Higham and Mary, 2019) with lambda = 8, times 3 for the ratio of a tensor's largest
// element to the terms its sums add, is 8 * 63 * 6e-8 * 3 = 9e-5: 1e-4. (The worst
// case, n u = 2.4e-4 times that ratio, needs every rounding in one direction.)
// bf16: every stored activation rounds to u = 2^-8, at about 48 places on that path,
// which the two backends place differently: the difference of two such walks is
// sqrt(2 * 48) u = 3.8e-2 at one standard deviation; 5e-2.
constexpr double kFp32GradientBound = 1e-4;
constexpr double kBf16GradientBound = 5e-2;

// Every tensor of the layout: max |a - b| <= bound * max |b| within it. worst (if not
// null) receives the largest ratio of that error to its tensor's max |b|.
inline ::testing::AssertionResult gradients_close(const ParamLayout& layout,
                                                  const std::vector<float>& a,
                                                  const std::vector<float>& b, double bound,
                                                  double* worst = nullptr) {
  double worst_ratio = 0.0;
  std::ostringstream failures;
  int bad = 0;
  for (const ParamEntry& e : layout.entries()) {
    double diff = 0.0, scale = 0.0;
    for (std::size_t i = e.offset; i < e.offset + e.numel; ++i) {
      const double d = std::fabs(double(a[i]) - double(b[i]));
      if (!(d <= diff)) diff = d;  // NaN sticks
      scale = std::max(scale, std::fabs(double(b[i])));
    }
    const double ratio = scale > 0 ? diff / scale : (diff == 0 ? 0.0 : INFINITY);
    if (!(ratio <= worst_ratio)) worst_ratio = ratio;
    if (!(ratio <= bound) && bad++ < 3)
      failures << " " << e.name << " (" << ratio << " of max " << scale << ")";
  }
  if (worst) *worst = worst_ratio;
  if (bad == 0) return ::testing::AssertionSuccess() << "worst " << worst_ratio;
  return ::testing::AssertionFailure()
         << bad << " tensors' gradients beyond " << bound << " of their largest:" << failures.str();
}

// The small GPT of the backend comparisons.
inline ModelConfig comparison_model() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 64;
  m.seq_len = 64;
  m.vocab_size = 101;  // padded to 128: the masked columns are exercised
  return m;
}

struct CheckedReplica {
  static constexpr int kBatch = 2;
  static constexpr float kLr = 1e-3f;
  CheckedReplica(std::unique_ptr<ops::Ops> backend, const TrainConfig& t,
                 const ActivationPolicy& policy = {})
      : ops(std::move(backend)),
        train(t),
        model(comparison_model(), kBatch, *ops, whole_model(comparison_model()), nullptr, policy),
        opt(*ops, model.layout(), t) {
    model.init_parameters(5);
  }
  // Forward, backward and one AdamW update (update count t) from the current
  // parameters; grads holds the step's gradients, update its check.
  float step(const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int t) {
    model.zero_grads();
    const float loss = model.forward(in.data(), tg.data(), 1.0f);
    model.backward_input();
    model.backward_weight();
    const std::size_t n = model.layout().total_floats();
    grads.resize(n);
    ops->download(grads.data(), model.grads(), n * sizeof(float));
    const AdamWState before = state();
    opt.step(model.params(), model.has_weight_copy() ? model.weights() : nullptr, model.grads(),
             kLr, 1.0f, t);
    update = adamw_layout_update_within_bound(model.layout(), train, kLr, 1.0f, t, before, grads,
                                              state(), &update_worst);
    return loss;
  }
  AdamWState state() {
    return download_adamw_state(*ops, model.params(), opt.exp_avg(), opt.exp_avg_sq(),
                                model.layout().total_floats());
  }
  std::vector<float> params() const {
    std::vector<float> p(model.layout().total_floats());
    model.read_params(p.data());
    return p;
  }

  std::unique_ptr<ops::Ops> ops;
  TrainConfig train;
  GptModel model;
  AdamW opt;
  std::vector<float> grads;  // host copy of the last step's gradients
  ::testing::AssertionResult update = ::testing::AssertionSuccess();
  double update_worst = 0.0;  // the last update's largest error / bound
};

}  // namespace pptrain::test_support
