// The unfused attention pieces (attention.cu) under the CUDA emulator, for float and bf16
// elements: the head permutations against their index formulas (with grouped key/value
// heads too, whose gradients are summed) and as exact inverses of each other, and the
// in-place causal softmax and its backward against a double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "emulated_kernels.hpp"
#include "emulation_test_util.hpp"

namespace pptrain::emulation_test {
namespace {

template <typename T>
class EmulatedAttention : public ::testing::Test {};
TYPED_TEST_SUITE(EmulatedAttention, ElementTypes, ElementTypeNames);

// (B, T, NH, NKV, hs, skew): odd head size (scalar), head sizes that take the packs, and
// a misaligned array; then grouped key/value heads (two and three query heads per
// key/value head).
constexpr int kHeadShapes[][6] = {{2, 5, 3, 3, 7, 0},  {2, 5, 3, 3, 16, 0}, {1, 3, 2, 2, 8, 0},
                                  {2, 5, 3, 3, 16, 1}, {2, 5, 4, 2, 16, 0}, {2, 5, 3, 1, 7, 1}};

TYPED_TEST(EmulatedAttention, HeadPermutationsAndTheirInverses) {
  using T = TypeParam;
  for (const auto& [B, Tn, NH, NKV, hs, skew] : kHeadShapes) {
    const int group = NH / NKV, W = (NH + 2 * NKV) * hs;  // W: a qkv row
    const std::size_t head = std::size_t(B) * NH * Tn * hs;  // one head-major array
    const std::size_t n_qkv = std::size_t(B) * Tn * W;
    // qkv[b, t, part, head, d], parts of NH, NKV and NKV heads.
    auto inter = [&](int b, int t, int part, int h, int d) {
      const int col = part == 0 ? h * hs : (NH + (part - 1) * NKV + h) * hs;
      return (std::size_t(b) * Tn + t) * W + col + d;
    };
    auto major = [&](int b, int h, int t, int d) {
      return ((std::size_t(b) * NH + h) * Tn + t) * hs + d;
    };
    const std::vector<float> qkv = rounded<T>(randn(n_qkv, 1)), y = rounded<T>(randn(head, 2));
    Device<T> dqkv(qkv, skew), q(head, skew), k(head, skew), v(head, skew);
    kern::split_heads<T>(q.get(), k.get(), v.get(), dqkv.get(), B, Tn, NH, NKV, hs, nullptr);
    const std::vector<float> got[3] = {q.read(), k.read(), v.read()};
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tn; ++t)
        for (int g = 0; g < 3; ++g)
          for (int h = 0; h < NH; ++h)
            for (int d = 0; d < hs; ++d)
              ASSERT_EQ(got[g][major(b, h, t, d)], qkv[inter(b, t, g, g ? h / group : h, d)])
                  << "split_heads " << b << t << g << h << d;
    // merge_qkv_grad: q's back where split_heads took them from; a key/value head's the
    // fp32 sum, in head order, of its group's heads.
    const std::vector<float> parts[3] = {rounded<T>(randn(head, 3)), rounded<T>(randn(head, 4)),
                                         rounded<T>(randn(head, 5))};
    Device<T> dq(parts[0], skew), dk(parts[1], skew), dv(parts[2], skew), back(n_qkv, skew);
    kern::merge_qkv_grad<T>(back.get(), dq.get(), dk.get(), dv.get(), B, Tn, NH, NKV, hs, nullptr);
    std::vector<float> want(n_qkv);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tn; ++t)
        for (int d = 0; d < hs; ++d) {
          for (int h = 0; h < NH; ++h) want[inter(b, t, 0, h, d)] = parts[0][major(b, h, t, d)];
          for (int g = 1; g < 3; ++g)
            for (int kvh = 0; kvh < NKV; ++kvh) {
              float sum = 0.0f;
              for (int h = kvh * group; h < (kvh + 1) * group; ++h)
                sum += parts[g][major(b, h, t, d)];
              want[inter(b, t, g, kvh, d)] = sum;
            }
        }
    EXPECT_TRUE(all_close(back.read(), rounded<T>(want), 0.0)) << "merge_qkv_grad";

    Device<T> dy(y, skew), out(head, skew), dy_back(head, skew);
    kern::merge_heads<T>(out.get(), dy.get(), B, Tn, NH, hs, nullptr);
    const std::vector<float> merged = out.read();
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tn; ++t)
        for (int h = 0; h < NH; ++h)
          for (int d = 0; d < hs; ++d)
            ASSERT_EQ(merged[((std::size_t(b) * Tn + t) * NH + h) * hs + d], y[major(b, h, t, d)])
                << "merge_heads " << b << t << h << d;
    kern::split_heads_grad<T>(dy_back.get(), out.get(), B, Tn, NH, hs, nullptr);
    EXPECT_TRUE(all_close(dy_back.read(), y, 0.0)) << "split_heads_grad inverts merge_heads";
  }
}

// Row r of att[BH,T,T] (query r % T): softmax of scale * s over [0, r % T], then zeros;
// backward: scale * p * (d - sum_j p_j d_j) on the live entries, zeros above.
std::vector<double> softmax_reference(const std::vector<float>& s, int rows, int Tn, float scale) {
  std::vector<double> p(s.size(), 0.0);
  for (int r = 0; r < rows; ++r) {
    const std::size_t o = std::size_t(r) * Tn;
    const int live = r % Tn + 1;
    double m = -INFINITY, sum = 0.0;
    for (int j = 0; j < live; ++j) m = std::fmax(m, double(scale) * s[o + j]);
    for (int j = 0; j < live; ++j) sum += std::exp(double(scale) * s[o + j] - m);
    for (int j = 0; j < live; ++j) p[o + j] = std::exp(double(scale) * s[o + j] - m) / sum;
  }
  return p;
}
std::vector<double> softmax_backward_reference(const std::vector<float>& d,
                                               const std::vector<float>& p, int rows, int Tn,
                                               float scale) {
  std::vector<double> g(d.size(), 0.0);
  for (int r = 0; r < rows; ++r) {
    const std::size_t o = std::size_t(r) * Tn;
    const int live = r % Tn + 1;
    double dot = 0.0;
    for (int j = 0; j < live; ++j) dot += double(p[o + j]) * d[o + j];
    for (int j = 0; j < live; ++j) g[o + j] = scale * double(p[o + j]) * (d[o + j] - dot);
  }
  return g;
}

TYPED_TEST(EmulatedAttention, CausalSoftmaxAndBackwardMatchReference) {
  using T = TypeParam;
  constexpr int kBH = 3;
  constexpr float kScale = 0.3f;
  // (T, skew): one column, short rows, rows longer than a warp (one and two passes), rows
  // that take the packs, a misaligned array.
  const int shapes[][2] = {{1, 0}, {5, 0}, {37, 0}, {40, 0}, {72, 0}, {40, 1}};
  for (const auto& [Tn, skew] : shapes) {
    const int rows = kBH * Tn;
    const std::size_t n = std::size_t(rows) * Tn;
    const std::vector<float> s = rounded<T>(randn(n, 3, 4.0f));
    Device<T> att(s, skew);
    kern::causal_softmax_forward<T>(att.get(), kScale, kBH, Tn, nullptr);
    const std::vector<float> p = att.read();
    EXPECT_TRUE(all_close(p, softmax_reference(s, rows, Tn, kScale), tol<T>(1e-5)))
        << "forward, T " << Tn;

    const std::vector<float> d = rounded<T>(randn(n, 4));
    Device<T> datt(d, skew);
    kern::causal_softmax_backward<T>(datt.get(), att.get(), kScale, kBH, Tn, nullptr);
    EXPECT_TRUE(
        all_close(datt.read(), softmax_backward_reference(d, p, rows, Tn, kScale), tol<T>(1e-5)))
        << "backward, T " << Tn;
  }
}

}  // namespace
}  // namespace pptrain::emulation_test
