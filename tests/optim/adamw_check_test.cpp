// The AdamW check (adamw_check.hpp) held against the CPU backend's update: it accepts
// the real update, and the real update with every output moved by one ulp; it rejects
// updates with a known mistake in the formula, each made by handing the real kernel
// wrong constants.
#include "adamw_check.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/random.hpp"
#include "ops/ops.hpp"

namespace pptrain::test_support {
namespace {

constexpr std::size_t kN = 4096;

ops::Ops& cpu() {
  static const std::unique_ptr<ops::Ops> backend = ops::make_cpu_ops(1);
  return *backend;
}

// n normal draws of key, each times 10^-(0..8) as the index says, one in 16 exactly 0:
// gradients from large to far below their neighbours' rounding.
std::vector<float> gradients(uint64_t key) {
  std::vector<float> g(kN);
  for (std::size_t i = 0; i < kN; ++i)
    g[i] = i % 16 == 0
               ? 0.0f
               : float(standard_normal(hash_words(key, i)) * std::pow(10.0, -double(i % 9)));
  return g;
}

AdamWState updated(AdamWState s, const std::vector<float>& g, const ops::AdamWStep& h) {
  cpu().adamw(s.params.data(), nullptr, g.data(), s.exp_avg.data(), s.exp_avg_sq.data(), kN, h);
  return s;
}

// GPT-2-like parameters after t-1 correct updates with fresh gradients: the state
// update t starts from.
AdamWState state_before(const AdamWSpec& spec) {
  AdamWState s{std::vector<float>(kN), std::vector<float>(kN, 0.0f), std::vector<float>(kN, 0.0f)};
  for (std::size_t i = 0; i < kN; ++i)
    s.params[i] = float(0.02 * standard_normal(hash_words(7, i)));
  for (int64_t t = 1; t < spec.t; ++t) {
    AdamWSpec earlier = spec;
    earlier.t = t;
    s = updated(s, gradients(100 + uint64_t(t)), adamw_step_constants(earlier));
  }
  return s;
}

std::vector<AdamWSpec> specs() {
  std::vector<AdamWSpec> out;
  for (int64_t t : {1, 2, 10})
    for (double beta2 : {0.95, 0.999})
      for (double eps : {1e-8, 1e-3}) {
        out.push_back({1e-3, 0.9, beta2, eps, 0.1, 1.0, t});
        out.push_back({3e-4, 0.9, beta2, eps, 0.0, 0.37, t});  // clipped, no decay
      }
  return out;
}

std::string describe(const AdamWSpec& s) {
  return "t " + std::to_string(s.t) + ", beta2 " + std::to_string(s.beta2) + ", eps " +
         std::to_string(s.eps) + ", wd " + std::to_string(s.weight_decay);
}

TEST(AdamWCheck, AcceptsTheBackendsUpdate) {
  double worst_of_all = 0.0;
  for (const AdamWSpec& spec : specs()) {
    const AdamWState before = state_before(spec);
    const std::vector<float> g = gradients(spec.t);
    const AdamWState after = updated(before, g, adamw_step_constants(spec));
    double worst = 0.0;
    EXPECT_TRUE(adamw_update_within_bound(before, g, after, spec, 0, kN, &worst)) << describe(spec);
    worst_of_all = std::max(worst_of_all, worst);
  }
  std::printf("largest error / bound of the CPU update: %.3g\n", worst_of_all);
}

TEST(AdamWCheck, AcceptsEveryOutputOneUlpAway) {
  for (const AdamWSpec& spec : specs()) {
    const AdamWState before = state_before(spec);
    const std::vector<float> g = gradients(spec.t);
    for (float direction : {INFINITY, -INFINITY}) {
      AdamWState after = updated(before, g, adamw_step_constants(spec));
      for (std::vector<float>* a : {&after.params, &after.exp_avg, &after.exp_avg_sq})
        for (float& x : *a) x = std::nextafter(x, direction);
      EXPECT_TRUE(adamw_update_within_bound(before, g, after, spec, 0, kN)) << describe(spec);
    }
  }
}

// Each a mistake an AdamW kernel or its caller could make, as the constants it would
// amount to.
const std::vector<std::pair<std::string, std::function<void(ops::AdamWStep&, const AdamWSpec&)>>>
    kMistakes = {
        {"no bias correction of m", [](auto& h, auto&) { h.inv_bias_correction1 = 1.0f; }},
        {"no bias correction of v", [](auto& h, auto&) { h.inv_bias_correction2 = 1.0f; }},
        {"bias corrections of t+1",
         [](auto& h, const AdamWSpec& s) {
           h.inv_bias_correction1 = float(1 / (1 - std::pow(s.beta1, double(s.t + 1))));
           h.inv_bias_correction2 = float(1 / (1 - std::pow(s.beta2, double(s.t + 1))));
         }},
        {"betas swapped",
         [](auto& h, auto&) {
           std::swap(h.beta1, h.beta2);
           std::swap(h.one_minus_beta1, h.one_minus_beta2);
         }},
        {"1 - beta from the fp32 beta",
         [](auto& h, auto&) {
           h.one_minus_beta1 = 1.0f - h.beta1;
           h.one_minus_beta2 = 1.0f - h.beta2;
         }},
        {"eps ten times too large", [](auto& h, auto&) { h.eps *= 10.0f; }},
        {"no weight decay", [](auto& h, auto&) { h.weight_decay = 0.0f; }},
        {"lr one part in 10^4 off", [](auto& h, auto&) { h.lr *= 1.0001f; }},
};

TEST(AdamWCheck, RejectsWrongUpdates) {
  for (const auto& [mistake, apply] : kMistakes) {
    // Each mistake must be caught in some spec where it changes the formula (eps
    // matters where it is large, 1 - beta2's rounding where beta2 is 0.999, decay where
    // there is decay).
    bool caught = false;
    double worst = 0.0;  // the largest error / bound it makes in any spec
    for (const AdamWSpec& spec : specs()) {
      ops::AdamWStep wrong = adamw_step_constants(spec);
      apply(wrong, spec);
      const AdamWState before = state_before(spec);
      const std::vector<float> g = gradients(spec.t);
      double w = 0.0;
      caught = !adamw_update_within_bound(before, g, updated(before, g, wrong), spec, 0, kN, &w) ||
               caught;
      worst = std::max(worst, w);
    }
    EXPECT_TRUE(caught) << mistake;
    std::printf("%s: largest error / bound %.3g\n", mistake.c_str(), worst);
  }
}

}  // namespace
}  // namespace pptrain::test_support
