// Tests for AdamW, the learning-rate schedules and the update control (clipping and
// skipped steps), against
// values computed by hand or by a plain double-precision reference in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.hpp"
#include "model/param_layout.hpp"
#include "optim/adamw.hpp"
#include "ops/ops.hpp"
#include "optim/lr_schedule.hpp"

namespace pptrain {
namespace {

// The CPU backend: its memory is host memory, so the arrays below are plain vectors.
ops::Ops& cpu() {
  static const std::unique_ptr<ops::Ops> backend = ops::make_cpu_ops(1);
  return *backend;
}

// A weight (decayed) and a bias (not decayed); the bias starts after an alignment gap.
ParamLayout tiny_layout() {
  ParamLayout layout;
  layout.add("w", {2, 3}, true);
  layout.add("b", {3}, false);
  return layout;
}

TrainConfig adam_config() {
  TrainConfig train;
  train.beta1 = 0.9;
  train.beta2 = 0.95;
  train.eps = 1e-8;
  train.weight_decay = 0.1;
  return train;
}

// Reference AdamW for one element, in double.
struct RefElement {
  double p, m = 0, v = 0;
  void step(double grad, double scale, double lr, double wd, const TrainConfig& c, int t) {
    const double g = grad * scale;
    m = c.beta1 * m + (1 - c.beta1) * g;
    v = c.beta2 * v + (1 - c.beta2) * g * g;
    const double m_hat = m / (1 - std::pow(c.beta1, t));
    const double v_hat = v / (1 - std::pow(c.beta2, t));
    p -= lr * (m_hat / (std::sqrt(v_hat) + c.eps) + wd * p);
  }
};

void expect_rel_near(double actual, double expected, double rel, const char* what, size_t i) {
  EXPECT_NEAR(actual, expected, rel * std::max(1e-3, std::abs(expected)))
      << what << "[" << i << "]";
}

TEST(AdamW, MatchesDoubleReferenceOverThreeSteps) {
  const ParamLayout layout = tiny_layout();
  TrainConfig train = adam_config();
  train.eps = 1e-3;  // large enough that where eps enters the formula matters
  ASSERT_EQ(layout.at("b").offset, 64u);
  const size_t n = layout.total_floats();

  std::vector<float> params(n), grads(n);
  std::vector<RefElement> ref;
  std::vector<size_t> index;
  std::vector<double> wd;
  for (const ParamEntry& e : layout.entries())
    for (size_t i = 0; i < e.numel; ++i) {
      const size_t k = e.offset + i;
      params[k] = 0.5f - 0.25f * float(k % 5);
      ref.push_back({params[k]});
      index.push_back(k);
      wd.push_back(e.decay ? train.weight_decay : 0.0);
    }

  AdamW opt(cpu(), layout, train);
  const float lrs[3] = {1e-2f, 5e-3f, 2e-2f};
  const float scales[3] = {0.5f, 2.0f, 0.25f};
  for (int t = 1; t <= 3; ++t) {
    for (size_t j = 0; j < index.size(); ++j) {
      // Varied signs and magnitudes, different every step.
      grads[index[j]] = float(((j * 7 + size_t(t) * 3) % 11) - 5) * 0.1f + 0.03f * float(t);
      ref[j].step(grads[index[j]], scales[t - 1], lrs[t - 1], wd[j], train, t);
    }
    opt.step(params.data(), nullptr, grads.data(), lrs[t - 1], scales[t - 1], t);
  }
  for (size_t j = 0; j < index.size(); ++j) {
    expect_rel_near(params[index[j]], ref[j].p, 1e-6, "param", j);
    expect_rel_near(opt.exp_avg()[index[j]], ref[j].m, 1e-6, "exp_avg", j);
    expect_rel_near(opt.exp_avg_sq()[index[j]], ref[j].v, 1e-6, "exp_avg_sq", j);
  }
}

TEST(AdamW, FirstStepIsLrTimesSignOfGradient) {
  // At t=1 the bias-corrected moments are g and g*g, so a no-decay element moves by
  // lr * g / (|g| + eps), i.e. lr * sign(g) up to eps / |g|.
  ParamLayout layout;
  layout.add("bias", {4}, false);
  TrainConfig train = adam_config();
  AdamW opt(cpu(), layout, train);
  std::vector<float> params = {1.0f, -2.0f, 0.0f, 3.0f};
  const std::vector<float> grads = {0.3f, -0.02f, 5.0f, -1e-3f};
  const float lr = 0.01f;
  opt.step(params.data(), nullptr, grads.data(), lr, 3.0f, 1);
  EXPECT_NEAR(params[0], 1.0f - lr, 1e-7);
  EXPECT_NEAR(params[1], -2.0f + lr, 1e-7);
  EXPECT_NEAR(params[2], 0.0f - lr, 1e-7);
  EXPECT_NEAR(params[3], 3.0f + lr, 1e-7);
}

TEST(AdamW, WeightDecayOnlyOnDecayEntries) {
  // A zero gradient leaves only the decay term: p -= lr * wd * p for decay entries.
  const ParamLayout layout = tiny_layout();
  const TrainConfig train = adam_config();
  AdamW opt(cpu(), layout, train);
  std::vector<float> params(layout.total_floats(), 2.0f), grads(layout.total_floats(), 0.0f);
  opt.step(params.data(), nullptr, grads.data(), 0.5f, 1.0f, 1);
  const ParamEntry& w = layout.at("w");
  const ParamEntry& b = layout.at("b");
  for (size_t i = 0; i < w.numel; ++i) EXPECT_FLOAT_EQ(params[w.offset + i], 2.0f * 0.95f);
  for (size_t i = 0; i < b.numel; ++i) EXPECT_FLOAT_EQ(params[b.offset + i], 2.0f);
}

TEST(AdamW, AlignmentGapsUntouched) {
  const ParamLayout layout = tiny_layout();
  AdamW opt(cpu(), layout, adam_config());
  const size_t n = layout.total_floats();
  const float sentinel = 123.25f;
  std::vector<float> params(n, sentinel);
  // NaN gradients in the gaps would poison any element the loop touched there.
  std::vector<float> grads(n, std::numeric_limits<float>::quiet_NaN());
  std::vector<bool> in_entry(n, false);
  for (const ParamEntry& e : layout.entries())
    for (size_t i = 0; i < e.numel; ++i) {
      in_entry[e.offset + i] = true;
      grads[e.offset + i] = 0.1f;
    }
  for (int t = 1; t <= 2; ++t) opt.step(params.data(), nullptr, grads.data(), 1e-2f, 1.0f, t);
  size_t gaps = 0;
  for (size_t k = 0; k < n; ++k) {
    if (in_entry[k]) {
      EXPECT_NE(params[k], sentinel) << k;
      continue;
    }
    ++gaps;
    EXPECT_EQ(params[k], sentinel) << k;
    EXPECT_EQ(opt.exp_avg()[k], 0.0f) << k;
    EXPECT_EQ(opt.exp_avg_sq()[k], 0.0f) << k;
  }
  EXPECT_EQ(gaps, 64u - 6u);
}

TEST(AdamW, RejectsZeroUpdateCount) {
  const ParamLayout layout = tiny_layout();
  AdamW opt(cpu(), layout, adam_config());
  std::vector<float> params(layout.total_floats()), grads(layout.total_floats());
  EXPECT_THROW(opt.step(params.data(), nullptr, grads.data(), 1e-3f, 1.0f, 0), std::logic_error);
}

TrainConfig schedule_config(LrSchedule kind) {
  TrainConfig train;
  train.lr = 1e-3;
  train.min_lr = 1e-4;
  train.steps = 110;
  train.warmup_steps = 10;  // decay runs over steps 10..109, progress = (step-10)/100
  train.lr_schedule = kind;
  return train;
}

TEST(LrSchedule, WarmupIsLinearFromLrOverWarmup) {
  for (const LrSchedule kind : {LrSchedule::Cosine, LrSchedule::Linear, LrSchedule::Constant}) {
    const TrainConfig train = schedule_config(kind);
    EXPECT_DOUBLE_EQ(learning_rate(train, 0), 1e-4) << name_of(kind);  // 1e-3 * 1/10
    EXPECT_DOUBLE_EQ(learning_rate(train, 4), 5e-4) << name_of(kind);  // 1e-3 * 5/10
    EXPECT_DOUBLE_EQ(learning_rate(train, 9), 1e-3) << name_of(kind);  // end of warmup
    EXPECT_DOUBLE_EQ(learning_rate(train, 10), 1e-3) << name_of(kind);  // decay progress 0
  }
}

TEST(LrSchedule, Cosine) {
  const TrainConfig train = schedule_config(LrSchedule::Cosine);
  // progress 0.25: 1e-4 + 0.5 * (1 + cos(pi/4)) * 9e-4
  EXPECT_NEAR(learning_rate(train, 35), 8.681980515339464e-4, 1e-15);
  EXPECT_NEAR(learning_rate(train, 60), 5.5e-4, 1e-15);  // midpoint
  // last step, progress 0.99: 1e-4 + 0.5 * (1 - cos(0.01 pi)) * 9e-4
  EXPECT_NEAR(learning_rate(train, 109), 1.002220478354208e-4, 1e-15);
  EXPECT_NEAR(learning_rate(train, 110), 1e-4, 1e-15);  // progress clamps at 1
  EXPECT_NEAR(learning_rate(train, 1000), 1e-4, 1e-15);
}

TEST(LrSchedule, Linear) {
  const TrainConfig train = schedule_config(LrSchedule::Linear);
  EXPECT_NEAR(learning_rate(train, 35), 7.75e-4, 1e-15);
  EXPECT_NEAR(learning_rate(train, 60), 5.5e-4, 1e-15);
  EXPECT_NEAR(learning_rate(train, 109), 1.09e-4, 1e-15);
  EXPECT_NEAR(learning_rate(train, 110), 1e-4, 1e-15);
  EXPECT_NEAR(learning_rate(train, 1000), 1e-4, 1e-15);
}

TEST(LrSchedule, Constant) {
  const TrainConfig train = schedule_config(LrSchedule::Constant);
  for (int64_t step : {10, 35, 60, 109, 110, 1000})
    EXPECT_DOUBLE_EQ(learning_rate(train, step), 1e-3) << step;
}

TEST(LrSchedule, NoWarmup) {
  TrainConfig train = schedule_config(LrSchedule::Cosine);
  train.warmup_steps = 0;
  train.steps = 100;
  EXPECT_DOUBLE_EQ(learning_rate(train, 0), 1e-3);
  EXPECT_NEAR(learning_rate(train, 50), 5.5e-4, 1e-15);
  EXPECT_NEAR(learning_rate(train, 100), 1e-4, 1e-15);
  train.lr_schedule = LrSchedule::Linear;
  EXPECT_DOUBLE_EQ(learning_rate(train, 0), 1e-3);
  EXPECT_NEAR(learning_rate(train, 25), 7.75e-4, 1e-15);
}

TEST(LrSchedule, WarmupLongerThanRun) {
  // steps - warmup <= 0: the span is 1, so the first step after warmup is at min_lr.
  TrainConfig train = schedule_config(LrSchedule::Linear);
  train.steps = 5;
  EXPECT_DOUBLE_EQ(learning_rate(train, 4), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(train, 10), 1e-3);
  EXPECT_NEAR(learning_rate(train, 11), 1e-4, 1e-15);
}


// The norm of every entry, as GradSync takes it on one rank.
double grad_norm(ops::Ops& ops, const ParamLayout& layout, const float* grads) {
  return std::sqrt(grad_square_sum(ops, layout, grads, [](const ParamEntry&) { return true; }));
}

TEST(GradNorm, MatchesHandSumAndIgnoresGaps) {
  const ParamLayout layout = tiny_layout();
  std::vector<float> grads(layout.total_floats(), 1e30f);  // gaps hold huge values
  const ParamEntry& w = layout.at("w");
  const ParamEntry& b = layout.at("b");
  const float wv[6] = {3, 0, 0, 0, -4, 0};
  const float bv[3] = {0, 12, 0};
  for (size_t i = 0; i < 6; ++i) grads[w.offset + i] = wv[i];
  for (size_t i = 0; i < 3; ++i) grads[b.offset + i] = bv[i];
  EXPECT_DOUBLE_EQ(grad_norm(cpu(), layout, grads.data()), 13.0);  // sqrt(9 + 16 + 144)
}

TEST(GradNorm, MatchesPlainSumOnOddSizes) {
  ParamLayout layout;
  layout.add("a", {37}, true);
  layout.add("b", {5, 3}, false);
  layout.add("c", {1}, false);
  std::vector<float> grads(layout.total_floats(), 0.0f);
  double sum = 0;
  for (const ParamEntry& e : layout.entries())
    for (size_t i = 0; i < e.numel; ++i) {
      const float g = std::sin(float(e.offset + i)) * 1e-3f;
      grads[e.offset + i] = g;
      sum += double(g) * double(g);
    }
  EXPECT_NEAR(grad_norm(cpu(), layout, grads.data()), std::sqrt(sum), 1e-15);
}

// The update's control (ops::Ops::update_control) from {loss, squared norm}: the
// clipping factor and whether the step updates at all.
std::pair<float, float> control(double loss, double norm, double clip) {
  const double stats[2] = {loss, norm * norm};
  float c[2] = {-1, -1};
  cpu().update_control(c, stats, clip);
  return {c[0], c[1]};
}

TEST(UpdateControl, ClipsAboveTheLimit) {
  EXPECT_EQ(control(1, 5.0, 0.0).first, 1.0f);  // clipping disabled
  EXPECT_EQ(control(1, 0.5, 1.0).first, 1.0f);  // below the limit
  EXPECT_EQ(control(1, 1.0, 1.0).first, 1.0f);  // exactly at the limit
  EXPECT_EQ(control(1, 2.0, 1.0).first, float(1.0 / (2.0 + 1e-6)));
  EXPECT_EQ(control(1, 40.0, 0.5).first, float(0.5 / (40.0 + 1e-6)));
  EXPECT_EQ(control(1, 40.0, 0.5).second, 1.0f);
}

TEST(UpdateControl, SkipsANonFiniteStep) {
  EXPECT_EQ(control(NAN, 1.0, 1.0).second, 0.0f);
  EXPECT_EQ(control(INFINITY, 1.0, 1.0).second, 0.0f);
  EXPECT_EQ(control(1.0, NAN, 1.0).second, 0.0f);
  EXPECT_EQ(control(1.0, INFINITY, 0.0).second, 0.0f);
}

TEST(UpdateControl, ASkippedUpdateChangesNothing) {
  const std::size_t n = 5;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n, 0.25f), v(n, 0.125f);
  const std::vector<float> p0 = p, m0 = m, v0 = v;
  const float skip[2] = {1.0f, 0.0f};
  ops::AdamWStep h{1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.1f, 10.0f, 20.0f, 1.0f, skip};
  cpu().adamw(p.data(), nullptr, g.data(), m.data(), v.data(), n, h);
  EXPECT_EQ(p, p0);
  EXPECT_EQ(m, m0);
  EXPECT_EQ(v, v0);
  const float half[2] = {0.5f, 1.0f};  // control[0] replaces grad_scale
  h.control = half;
  std::vector<float> p2 = p0, m2 = m0, v2 = v0, g2(n, 0.25f);
  cpu().adamw(p.data(), nullptr, g.data(), m.data(), v.data(), n, h);
  h.control = nullptr;
  cpu().adamw(p2.data(), nullptr, g2.data(), m2.data(), v2.data(), n, h);
  EXPECT_EQ(p, p2);
  EXPECT_EQ(m, m2);
  EXPECT_EQ(v, v2);
}

// The multi-tensor update is the per-tensor one, bit for bit, however the threads split
// the elements: segments of every size, with their own weight decay, moments packed
// apart from the arena, on one thread and on two.
TEST(AdamWSegments, EqualThePerTensorUpdateOnAnyThreadCount) {
  ops::AdamWStep h{1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.0f, 10.0f, 20.0f, 0.75f};
  std::vector<ops::AdamWSegment> segments;
  std::size_t arena = 0, state = 5;
  for (std::size_t i = 0; i < 40; ++i) {
    const std::size_t n = i % 3 == 0 ? 1 + i : 20000 + 7 * i;
    segments.push_back({arena, arena, state, n, i % 2 ? 0.1f : 0.0f});
    arena += n + 3, state += n;
  }
  auto filled = [](std::size_t n, float scale) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = scale * float((i * 7919) % 1000) / 1000.0f;
    return x;
  };
  const std::vector<float> p0 = filled(arena, 1.0f), g = filled(arena, -0.5f);
  const std::vector<float> m0 = filled(state, 0.1f), v0 = filled(state, 0.01f);
  std::vector<float> p = p0, m = m0, v = v0;
  for (const ops::AdamWSegment& s : segments) {
    h.weight_decay = s.weight_decay;
    cpu().adamw(p.data() + s.param, nullptr, g.data() + s.arena, m.data() + s.state,
                v.data() + s.state, s.n, h);
  }
  for (int threads : {1, 2}) {
    const auto ops = ops::make_cpu_ops(threads);
    std::vector<float> p1 = p0, m1 = m0, v1 = v0;
    ops->adamw_segments(p1.data(), nullptr, g.data(), m1.data(), v1.data(), segments, h);
    EXPECT_EQ(p1, p) << threads << " threads";
    EXPECT_EQ(m1, m) << threads << " threads";
    EXPECT_EQ(v1, v) << threads << " threads";
  }
}

}  // namespace
}  // namespace pptrain
