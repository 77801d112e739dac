// Helpers for the ops tests: seeded random tensors, a central-difference gradient
// checker, and double-precision reference implementations.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/random.hpp"

namespace pptrain::ops::testing {

// n standard-normal floats (times `scale`), a pure function of `seed`.
inline std::vector<float> randn(std::size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale * static_cast<float>(standard_normal(hash_words(seed, i)));
  return v;
}

// sum_i a[i] * r[i], in double.
inline double dot(const std::vector<float>& a, const std::vector<float>& r) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * r[i];
  return s;
}

inline std::vector<std::size_t> all_indices(std::size_t n) {
  std::vector<std::size_t> idx(n);
  for (std::size_t i = 0; i < n; ++i) idx[i] = i;
  return idx;
}

// `count` distinct indices below n, chosen by `seed` (all of them when count >= n).
inline std::vector<std::size_t> some_indices(std::size_t n, std::size_t count, uint64_t seed) {
  std::vector<std::size_t> idx = all_indices(n);
  if (count >= n) return idx;
  for (std::size_t i = 0; i < count; ++i) {  // partial Fisher-Yates
    std::size_t j = i + static_cast<std::size_t>(uniform01(hash_words(seed, i)) * (n - i));
    std::swap(idx[i], idx[std::min(j, n - 1)]);
  }
  idx.resize(count);
  return idx;
}

struct GradReport {
  int checked = 0;
  int bad = 0;
  std::string first_bad;  // "index: analytic vs numeric" of the first mismatch
};

// Compares analytic[i] with the central difference of loss() in x[i] for every i in
// `which`. The step actually taken in fp32 is used as the divisor. A mismatch is
// |num - ana| > atol + rtol * max(|num|, |ana|).
inline GradReport check_gradient(std::vector<float>& x, const std::vector<float>& analytic,
                                 const std::function<double()>& loss,
                                 const std::vector<std::size_t>& which, float h = 1e-3f,
                                 double rtol = 1e-2, double atol = 2e-3) {
  GradReport rep;
  for (std::size_t i : which) {
    const float orig = x[i];
    const float xp = orig + h;
    const float xm = orig - h;
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = orig;
    const double num = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    const double ana = analytic[i];
    ++rep.checked;
    if (std::fabs(num - ana) > atol + rtol * std::max(std::fabs(num), std::fabs(ana))) {
      if (rep.bad++ == 0) {
        std::ostringstream s;
        s << "index " << i << ": analytic " << ana << " vs numeric " << num;
        rep.first_bad = s.str();
      }
    }
  }
  return rep;
}

// Index of element i of query head h's q (part 0), k (part 1) or v (part 2) at row
// (b, t) of qkv[B,T,W]: NH query heads, then NKV key and NKV value heads, of C/NH each;
// query head h uses key/value head h / (NH/NKV).
inline std::size_t qkv_index(int b, int t, int part, int h, int i, int T, int C, int NH,
                             int NKV) {
  const int hs = C / NH, Ckv = NKV * hs;
  const std::size_t row = (static_cast<std::size_t>(b) * T + t) * (C + 2 * Ckv);
  const int kvh = h / (NH / NKV);
  return row + (part == 0 ? h * hs : C + (part - 1) * Ckv + kvh * hs) + i;
}

// Causal attention in double: out[B,T,C] and att[B,NH,T,T] from qkv[B,T,W] (qkv_index).
inline void reference_attention(std::vector<double>& out, std::vector<double>& att,
                                const std::vector<float>& qkv, int B, int T, int C, int NH,
                                int NKV) {
  const int hs = C / NH;
  out.assign(static_cast<std::size_t>(B) * T * C, 0.0);
  att.assign(static_cast<std::size_t>(B) * NH * T * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) {
    return static_cast<double>(qkv[qkv_index(b, t, part, h, i, T, C, NH, NKV)]);
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double* a = &att[((static_cast<std::size_t>(b) * NH + h) * T + t) * T];
        double maxv = -1e300;
        for (int j = 0; j <= t; ++j) {
          double s = 0.0;
          for (int i = 0; i < hs; ++i) s += at(b, t, 0, h, i) * at(b, j, 1, h, i);
          a[j] = s / std::sqrt(static_cast<double>(hs));
          maxv = std::max(maxv, a[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += (a[j] = std::exp(a[j] - maxv));
        for (int j = 0; j <= t; ++j) a[j] /= sum;
        for (int i = 0; i < hs; ++i) {
          double o = 0.0;
          for (int j = 0; j <= t; ++j) o += a[j] * at(b, j, 2, h, i);
          out[(static_cast<std::size_t>(b) * T + t) * C + h * hs + i] = o;
        }
      }
}

// Gradient of sum(out * dout) w.r.t. qkv, in double, by the chain rule written out
// element by element (independent of the GEMM formulation in the backend); a key/value
// head collects from every query head that uses it.
inline std::vector<double> reference_attention_backward(const std::vector<float>& qkv,
                                                        const std::vector<float>& dout, int B,
                                                        int T, int C, int NH, int NKV) {
  const int hs = C / NH;
  std::vector<double> out, att;
  reference_attention(out, att, qkv, B, T, C, NH, NKV);
  std::vector<double> dqkv(qkv.size(), 0.0);
  auto idx = [&](int b, int t, int part, int h, int i) {
    return qkv_index(b, t, part, h, i, T, C, NH, NKV);
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* a = &att[((static_cast<std::size_t>(b) * NH + h) * T + t) * T];
        const float* d = &dout[(static_cast<std::size_t>(b) * T + t) * C + h * hs];
        std::vector<double> datt(t + 1, 0.0);
        for (int j = 0; j <= t; ++j)
          for (int i = 0; i < hs; ++i) {
            datt[j] += d[i] * static_cast<double>(qkv[idx(b, j, 2, h, i)]);
            dqkv[idx(b, j, 2, h, i)] += a[j] * d[i];
          }
        double s = 0.0;
        for (int j = 0; j <= t; ++j) s += a[j] * datt[j];
        for (int j = 0; j <= t; ++j) {
          const double g = a[j] * (datt[j] - s) * scale;
          for (int i = 0; i < hs; ++i) {
            dqkv[idx(b, t, 0, h, i)] += g * qkv[idx(b, j, 1, h, i)];
            dqkv[idx(b, j, 1, h, i)] += g * qkv[idx(b, t, 0, h, i)];
          }
        }
      }
  return dqkv;
}

}  // namespace pptrain::ops::testing
