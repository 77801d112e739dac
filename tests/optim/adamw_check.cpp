// The double-precision AdamW reference and its rounding bound (see adamw_check.hpp).
//
// The fp32 update (ops::Ops::adamw) is a chain of single operations, each rounded once:
// |fl(x op y) - x op y| <= u |x op y| with u = 2^-24; each fp32 constant is the spec's
// double value rounded once, so it too carries a relative error of at most u. Carrying
// absolute error bounds e(.) through the chain to first order, with exact inputs p, m0,
// v0, g (the backend's own) and c1 = 1 - b1, c2 = 1 - b2:
//   gs = g*s                  e(gs) = u|gs|                      (s exact: an fp32 input)
//   m  = b1*m0 + c1*gs        e(m)  = u(2|b1 m0| + 3|c1 gs| + |m|)
//   v  = b2*v0 + c2*gs*gs     e(v)  = u(2 b2 v0 + 5 c2 gs^2 + v)
//   mh = m*bc1, vh = v*bc2    e(mh) = bc1 e(m) + 2u|mh|, e(vh) likewise
//   r  = sqrt(vh)             e(r)  = min(e(vh)/(2r), sqrt(e(vh))) + u r
//   d  = r + eps              e(d)  = e(r) + u eps + u d
//   q  = mh/d                 e(q)  = (e(mh) + |q| e(d))/d + u|q|
//   st = q + wd*p             e(st) = e(q) + 2u|wd p| + u|st|
//   p' = p - lr*st            e(p') = lr e(st) + u lr|st| + u|p'|
// The check allows 2 e(.) (the second-order terms, products of two u's, are far below
// the first-order ones) plus one ulp of the reference value, the difference a correct
// kernel that contracts an operation into an FMA, or orders one differently, may show;
// and 16 FLT_MIN absolute, for a backend that flushes subnormals. A wrong formula moves
// an element by a sizeable fraction of lr, or of m and v, against bounds of a few u.
#include "adamw_check.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>

namespace pptrain::test_support {
namespace {

constexpr double kU = 0x1p-24;             // fp32 unit roundoff
constexpr double kFloor = 16.0 * FLT_MIN;  // subnormal flushing

double ulp(double x) {
  const float f = std::fabs(float(x));
  return double(std::nextafter(f, INFINITY)) - double(f);
}

// The reference value of one array's element and its first-order error bound.
struct Bounded {
  double value, error;
  double allowed() const { return 2.0 * error + ulp(value) + kFloor; }
};

struct ElementUpdate {
  Bounded p, m, v;
};

ElementUpdate reference_update(double p, double m0, double v0, double g, double wd,
                               const AdamWSpec& s) {
  const double c1 = 1.0 - s.beta1, c2 = 1.0 - s.beta2;
  const double bc1 = 1.0 / (1.0 - std::pow(s.beta1, double(s.t)));
  const double bc2 = 1.0 / (1.0 - std::pow(s.beta2, double(s.t)));
  const double gs = g * s.grad_scale;
  const double m = s.beta1 * m0 + c1 * gs;
  const double v = s.beta2 * v0 + c2 * gs * gs;
  const double e_m = kU * (2 * std::fabs(s.beta1 * m0) + 3 * std::fabs(c1 * gs) + std::fabs(m));
  const double e_v = kU * (2 * s.beta2 * v0 + 5 * c2 * gs * gs + v);
  const double mh = m * bc1, vh = v * bc2;
  const double e_mh = bc1 * e_m + 2 * kU * std::fabs(mh);
  const double e_vh = bc2 * e_v + 2 * kU * vh;
  const double r = std::sqrt(vh);
  const double e_r = (r > 0 ? std::min(e_vh / (2 * r), std::sqrt(e_vh)) : std::sqrt(e_vh)) + kU * r;
  const double d = r + s.eps;
  const double e_d = e_r + kU * s.eps + kU * d;
  const double q = mh / d;
  const double e_q = (e_mh + std::fabs(q) * e_d) / d + kU * std::fabs(q);
  const double st = q + wd * p;
  const double e_st = e_q + 2 * kU * std::fabs(wd * p) + kU * std::fabs(st);
  const double p1 = p - s.lr * st;
  const double e_p = s.lr * e_st + kU * s.lr * std::fabs(st) + kU * std::fabs(p1);
  return {{p1, e_p}, {m, e_m}, {v, e_v}};
}

// Accumulates the comparison of elements against their bounds; reports the first miss.
class Verdict {
 public:
  void check(const char* array, std::size_t i, double got, const Bounded& want) {
    const double err = std::fabs(got - want.value), allowed = want.allowed();
    const double ratio = err / allowed;
    if (!(ratio <= worst_)) worst_ = ratio;  // NaN sticks
    if (!(err <= allowed) && bad_++ == 0) {
      std::ostringstream s;
      s << array << "[" << i << "]: got " << got << ", reference " << want.value << ", error "
        << err << " > bound " << allowed;
      first_ = s.str();
    }
  }
  void unchanged(const char* array, std::size_t i, float before, float after) {
    if (std::memcmp(&before, &after, sizeof before) == 0) return;
    if (bad_++ == 0)
      first_ = std::string(array) + " changed between entries at " + std::to_string(i);
  }
  ::testing::AssertionResult result(double* worst) const {
    if (worst) *worst = worst_;
    if (bad_ == 0) return ::testing::AssertionSuccess() << "worst error/bound " << worst_;
    return ::testing::AssertionFailure() << bad_ << " elements outside the AdamW bound; first "
                                         << first_ << "; worst error/bound " << worst_;
  }

 private:
  std::size_t bad_ = 0;
  double worst_ = 0.0;
  std::string first_;
};

void check_range(Verdict& verdict, const AdamWState& before, const std::vector<float>& grads,
                 const AdamWState& after, const AdamWSpec& spec, double wd, std::size_t begin,
                 std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    const ElementUpdate want = reference_update(before.params[i], before.exp_avg[i],
                                                before.exp_avg_sq[i], grads[i], wd, spec);
    verdict.check("params", i, after.params[i], want.p);
    verdict.check("exp_avg", i, after.exp_avg[i], want.m);
    verdict.check("exp_avg_sq", i, after.exp_avg_sq[i], want.v);
  }
}

}  // namespace

ops::AdamWStep adamw_step_constants(const AdamWSpec& s) {
  ops::AdamWStep h{};
  h.lr = float(s.lr);
  h.beta1 = float(s.beta1);
  h.beta2 = float(s.beta2);
  h.one_minus_beta1 = float(1.0 - s.beta1);
  h.one_minus_beta2 = float(1.0 - s.beta2);
  h.eps = float(s.eps);
  h.weight_decay = float(s.weight_decay);
  h.inv_bias_correction1 = float(1.0 / (1.0 - std::pow(s.beta1, double(s.t))));
  h.inv_bias_correction2 = float(1.0 / (1.0 - std::pow(s.beta2, double(s.t))));
  h.grad_scale = float(s.grad_scale);
  return h;
}

::testing::AssertionResult adamw_update_within_bound(const AdamWState& before,
                                                     const std::vector<float>& grads,
                                                     const AdamWState& after, const AdamWSpec& spec,
                                                     std::size_t begin, std::size_t end,
                                                     double* worst) {
  Verdict verdict;
  check_range(verdict, before, grads, after, spec, spec.weight_decay, begin, end);
  return verdict.result(worst);
}

::testing::AssertionResult adamw_layout_update_within_bound(
    const ParamLayout& layout, const TrainConfig& train, float lr, float grad_scale, int64_t t,
    const AdamWState& before, const std::vector<float>& grads, const AdamWState& after,
    double* worst) {
  const AdamWSpec spec{lr, train.beta1, train.beta2, train.eps, train.weight_decay, grad_scale, t};
  Verdict verdict;
  auto unchanged = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      verdict.unchanged("params", i, before.params[i], after.params[i]);
      verdict.unchanged("exp_avg", i, before.exp_avg[i], after.exp_avg[i]);
      verdict.unchanged("exp_avg_sq", i, before.exp_avg_sq[i], after.exp_avg_sq[i]);
    }
  };
  std::size_t next = 0;  // first element not yet checked
  for (const ParamEntry& e : layout.entries()) {
    unchanged(next, e.offset);
    check_range(verdict, before, grads, after, spec, e.decay ? train.weight_decay : 0.0, e.offset,
                e.offset + e.numel);
    next = e.offset + e.numel;
  }
  unchanged(next, before.params.size());
  return verdict.result(worst);
}

AdamWState download_adamw_state(ops::Ops& ops, const float* params, const float* exp_avg,
                                const float* exp_avg_sq, std::size_t n) {
  AdamWState s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  ops.download(s.params.data(), params, n * sizeof(float));
  ops.download(s.exp_avg.data(), exp_avg, n * sizeof(float));
  ops.download(s.exp_avg_sq.data(), exp_avg_sq, n * sizeof(float));
  return s;
}

}  // namespace pptrain::test_support
