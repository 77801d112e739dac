// Finite-difference gradient checks for every backward op of the CPU backend:
// L = sum(out * R) for a fixed random R, central differences in each input element,
// compared with the gradient the backward ops return.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops {
namespace {

using testing::all_indices;
using testing::check_gradient;
using testing::dot;
using testing::GradReport;
using testing::randn;
using testing::some_indices;

class OpsGradTest : public ::testing::Test {
 protected:
  std::unique_ptr<CpuOps> ops = std::make_unique<CpuOps>(1);
};

void expect_ok(const GradReport& r, const char* what) {
  EXPECT_GT(r.checked, 0) << what;
  EXPECT_EQ(r.bad, 0) << what << " (" << r.bad << " of " << r.checked << " bad), first "
                      << r.first_bad;
}

// The checker itself must reject a wrong gradient, or every test below is void.
TEST_F(OpsGradTest, CheckerRejectsWrongGradients) {
  std::vector<float> x = randn(20, 1);
  std::vector<float> r = randn(20, 2);
  auto loss = [&] {  // L = sum(r * x^2), dL/dx = 2 r x
    double s = 0;
    for (std::size_t i = 0; i < x.size(); ++i) s += double(r[i]) * x[i] * x[i];
    return s;
  };
  std::vector<float> good(20);
  for (int i = 0; i < 20; ++i) good[i] = 2 * r[i] * x[i];
  expect_ok(check_gradient(x, good, loss, all_indices(20)), "exact gradient");
  std::vector<float> scaled = good, one_off = good;
  for (float& g : scaled) g *= 1.05f;
  one_off[7] += 0.05f;
  EXPECT_GT(check_gradient(x, scaled, loss, all_indices(20)).bad, 10);
  EXPECT_EQ(check_gradient(x, one_off, loss, all_indices(20)).bad, 1);
}

// A Conv1D-style linear layer out = x @ W + b, W stored (in, out) as GPT-2 does,
// and the nn.Linear form out = x @ W^T with W stored (out, in).
TEST_F(OpsGradTest, LinearThroughGemm) {
  const int N = 6, Cin = 5, Cout = 7;
  for (bool w_out_in : {false, true}) {
    std::vector<float> x = randn(N * Cin, 10), w = randn(Cin * Cout, 11), b = randn(Cout, 12);
    const std::vector<float> R = randn(N * Cout, 13);
    std::vector<float> out(N * Cout);
    auto forward = [&] {
      ops->gemm(false, w_out_in, N, Cout, Cin, 1.0f, x.data(), w.data(), 0.0f, out.data());
      ops->add_bias(out.data(), b.data(), N, Cout);
    };
    auto loss = [&] {
      forward();
      return dot(out, R);
    };
    std::vector<float> dx(N * Cin), dw(Cin * Cout, 0.0f), db(Cout, 0.0f);
    // dx = dout @ W^T (or dout @ W); dW = x^T @ dout (or dout^T @ x); db = colsum(dout).
    ops->gemm(false, !w_out_in, N, Cin, Cout, 1.0f, R.data(), w.data(), 0.0f, dx.data());
    if (w_out_in)
      ops->gemm(true, false, Cout, Cin, N, 1.0f, R.data(), x.data(), 1.0f, dw.data());
    else
      ops->gemm(true, false, Cin, Cout, N, 1.0f, x.data(), R.data(), 1.0f, dw.data());
    ops->bias_backward(db.data(), R.data(), N, Cout);
    expect_ok(check_gradient(x, dx, loss, all_indices(x.size())), "linear dx");
    expect_ok(check_gradient(w, dw, loss, all_indices(w.size())), "linear dW");
    expect_ok(check_gradient(b, db, loss, all_indices(b.size())), "linear db");
  }
}

TEST_F(OpsGradTest, AddBias) {
  const int N = 4, C = 6;
  std::vector<float> x = randn(N * C, 20), bias = randn(C, 21);
  const std::vector<float> R = randn(N * C, 22);
  std::vector<float> out(N * C);
  auto loss = [&] {
    out = x;
    ops->add_bias(out.data(), bias.data(), N, C);
    return dot(out, R);
  };
  std::vector<float> dbias(C, 0.0f);
  ops->bias_backward(dbias.data(), R.data(), N, C);
  expect_ok(check_gradient(bias, dbias, loss, all_indices(C)), "dbias");
  expect_ok(check_gradient(x, R, loss, all_indices(x.size())), "dx of add_bias");
}

TEST_F(OpsGradTest, LayerNorm) {
  const int N = 5, C = 12;
  std::vector<float> x = randn(N * C, 30, 2.0f), w = randn(C, 31), b = randn(C, 32);
  for (int i = 0; i < N * C; ++i) x[i] += 0.5f * (i % C);  // non-zero row means
  const std::vector<float> R = randn(N * C, 33);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    ops->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                           C);
    return dot(out, R);
  };
  loss();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  ops->layernorm_backward_input(dx.data(), dx.data(), R.data(), x.data(), w.data(), mean.data(),
                                rstd.data(), N, C);
  ops->layernorm_backward_weight(dw.data(), db.data(), R.data(), x.data(), mean.data(), rstd.data(),
                                 N, C);
  expect_ok(check_gradient(x, dx, loss, all_indices(x.size())), "layernorm dinp");
  expect_ok(check_gradient(w, dw, loss, all_indices(C)), "layernorm dw");
  expect_ok(check_gradient(b, db, loss, all_indices(C)), "layernorm db");
}

TEST_F(OpsGradTest, RmsNorm) {
  const int N = 5, C = 12;
  std::vector<float> x = randn(N * C, 130, 2.0f), w = randn(C, 131);
  const std::vector<float> R = randn(N * C, 133);
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    ops->rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    return dot(out, R);
  };
  loss();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
  ops->rmsnorm_backward_input(dx.data(), dx.data(), R.data(), x.data(), w.data(), rstd.data(), N,
                              C);
  ops->rmsnorm_backward_weight(dw.data(), R.data(), x.data(), rstd.data(), N, C);
  expect_ok(check_gradient(x, dx, loss, all_indices(x.size())), "rmsnorm dinp");
  expect_ok(check_gradient(w, dw, loss, all_indices(C)), "rmsnorm dw");
}

TEST_F(OpsGradTest, SwiGlu) {
  const int N = 4, F = 9;
  std::vector<float> gate_up = randn(N * 2 * F, 140, 3.0f);
  const std::vector<float> R = randn(N * F, 141);
  std::vector<float> out(N * F), dgate_up(N * 2 * F);
  auto loss = [&] {
    ops->swiglu_forward(out.data(), gate_up.data(), N, F);
    return dot(out, R);
  };
  ops->swiglu_backward(dgate_up.data(), R.data(), gate_up.data(), N, F);
  expect_ok(check_gradient(gate_up, dgate_up, loss, all_indices(gate_up.size())), "swiglu");
}

// The rotation's gradient is the inverse rotation of the output's gradient; the inverse
// undoes the rotation; heads past `heads` and the pairs at position 0 are left alone. The
// same for rows of a piece of the sequence that starts at position 5 (context parallelism).
TEST_F(OpsGradTest, RotaryEmbedding) {
  for (const int first : {0, 5}) {
  SCOPED_TRACE("first position " + std::to_string(first));
  const int N = 6, T = 4, heads = 2, hs = 8, stride = 3 * hs;
  std::vector<float> x = randn(N * stride, 150);
  const std::vector<float> R = randn(N * stride, 151);
  std::vector<float> out(x.size());
  auto loss = [&] {
    out = x;
    ops->rope(out.data(), N, T, stride, heads, hs, 10000.0f, false, first);
    return dot(out, R);
  };
  std::vector<float> dx = R;
  ops->rope(dx.data(), N, T, stride, heads, hs, 10000.0f, true, first);
  expect_ok(check_gradient(x, dx, loss, all_indices(x.size())), "rope");
  loss();
  std::vector<float> back = out;
  ops->rope(back.data(), N, T, stride, heads, hs, 10000.0f, true, first);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-5) << i;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < stride; ++c) {
      const std::size_t i = std::size_t(n) * stride + c;
      if (c >= heads * hs || first + n % T == 0)
        EXPECT_EQ(out[i], x[i]) << "row " << n << " column " << c;
    }
  }
}

TEST_F(OpsGradTest, Gelu) {
  const std::size_t n = 64;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = -4.0f + 8.0f * float(i) / float(n - 1) + 0.01f;
  const std::vector<float> R = randn(n, 40);
  std::vector<float> out(n), dx(n);
  auto loss = [&] {
    ops->gelu_forward(out.data(), x.data(), n);
    return dot(out, R);
  };
  ops->gelu_backward(dx.data(), x.data(), R.data(), n);
  expect_ok(check_gradient(x, dx, loss, all_indices(n)), "gelu");
}

// Elements of qkv rows with NH query heads and NKV key and value heads of C/NH.
int qkv_width(int C, int NH, int NKV) { return C + 2 * (C / NH) * NKV; }

// Multi-head (NKV = NH) and grouped-query attention: two query heads per key/value head,
// and all four on one. Checks every element of qkv, or `sampled` of them (0: all).
void check_attention_gradient(CpuOps& ops, int B, int T, std::size_t sampled, uint64_t seed) {
  const int C = 8;
  for (const auto& [NH, NKV] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 1}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " NH " + std::to_string(NH) + " NKV " +
                 std::to_string(NKV));
    std::vector<float> qkv = randn(B * T * qkv_width(C, NH, NKV), seed);
    const std::vector<float> R = randn(B * T * C, seed + 1);
    std::vector<float> out(B * T * C), att(B * NH * T * T);
    auto loss = [&] {
      ops.attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
      return dot(out, R);
    };
    loss();
    std::vector<float> dqkv(qkv.size(), 123.0f);  // must be overwritten
    ops.attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH, NKV);
    const auto indices = sampled ? some_indices(qkv.size(), sampled, seed + 2)
                                 : all_indices(qkv.size());
    expect_ok(check_gradient(qkv, dqkv, loss, indices), "attention dqkv");
  }
}

TEST_F(OpsGradTest, Attention) { check_attention_gradient(*ops, 2, 5, 0, 50); }

// T spans several internal row blocks; a random subset of elements.
TEST_F(OpsGradTest, AttentionAcrossRowBlocks) { check_attention_gradient(*ops, 1, 150, 150, 52); }

// The blocked (flash-style) attention: finite differences over several row blocks, and
// the same outputs and gradients as the form that keeps the probabilities.
TEST_F(OpsGradTest, BlockedAttentionAcrossRowBlocks) {
  const int B = 2, T = 150, C = 8;
  for (const auto& [NH, NKV] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 1}}) {
    SCOPED_TRACE("NH " + std::to_string(NH) + " NKV " + std::to_string(NKV));
    std::vector<float> qkv = randn(B * T * qkv_width(C, NH, NKV), 55);
    const std::vector<float> R = randn(B * T * C, 56);
    std::vector<float> out(B * T * C), lse(B * NH * T);
    auto loss = [&] {
      ops->attention_forward_blocked(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
      return dot(out, R);
    };
    loss();
    std::vector<float> dqkv(qkv.size(), 123.0f);  // must be overwritten
    ops->attention_backward_blocked(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), B,
                                    T, C, NH, NKV);
    expect_ok(check_gradient(qkv, dqkv, loss, some_indices(qkv.size(), 200, 57)),
              "blocked attention dqkv (T=150)");
  }
}

TEST_F(OpsGradTest, BlockedAttentionMatchesTheProbabilityForm) {
  for (int NKV : {4, 2, 1})
    for (int T : {1, 7, 64, 65, 150}) {
      const int B = 2, C = 32, NH = 4, n = B * T * qkv_width(C, NH, NKV);
      SCOPED_TRACE("NKV " + std::to_string(NKV) + " T " + std::to_string(T));
      const std::vector<float> qkv = randn(n, 60 + T), R = randn(B * T * C, 90 + T);
      std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(qkv.size());
      ops->attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
      ops->attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH, NKV);
      std::vector<float> out_b(out.size()), lse(B * NH * T), dqkv_b(qkv.size());
      ops->attention_forward_blocked(out_b.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
      ops->attention_backward_blocked(dqkv_b.data(), R.data(), qkv.data(), out_b.data(),
                                      lse.data(), B, T, C, NH, NKV);
      for (std::size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out_b[i], out[i], 2e-6f * (1.0f + std::fabs(out[i]))) << "out " << i;
      for (std::size_t i = 0; i < dqkv.size(); ++i)
        ASSERT_NEAR(dqkv_b[i], dqkv[i], 2e-5f * (1.0f + std::fabs(dqkv[i]))) << "dqkv " << i;
    }
}

TEST_F(OpsGradTest, EmbeddingWithRepeatedTokens) {
  const int B = 3, T = 4, C = 5, V = 7;
  const std::vector<int32_t> tokens = {1, 3, 1, 6, 0, 3, 3, 2, 6, 1, 5, 1};
  std::vector<float> wte = randn(V * C, 60), wpe = randn(T * C, 61);
  const std::vector<float> R = randn(B * T * C, 62);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    ops->embedding_forward(out.data(), tokens.data(), wte.data(), 0, V, wpe.data(), B, T, C);
    return dot(out, R);
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  ops->embedding_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), 0, V, B, T, C);
  expect_ok(check_gradient(wte, dwte, loss, all_indices(wte.size())), "dwte");
  expect_ok(check_gradient(wpe, dwpe, loss, all_indices(wpe.size())), "dwpe");
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[4 * C + c], 0.0f) << "token 4 is unused";
}

TEST_F(OpsGradTest, CrossEntropy) {
  // L = dloss * sum_n losses[n]; padded columns get zero gradient, numerically too.
  const int N = 4, V = 6, Vp = 8;
  const float dloss = 0.37f;
  std::vector<float> logits = randn(N * Vp, 70, 2.0f);
  const std::vector<int32_t> targets = {0, 5, 2, 2};
  std::vector<float> losses(N);
  auto loss = [&] {
    ops->cross_entropy(losses.data(), nullptr, logits.data(), targets.data(), N, V, Vp, dloss);
    double s = 0;
    for (float l : losses) s += l;
    return dloss * s;
  };
  std::vector<float> dlogits(N * Vp, 99.0f);
  ops->cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, Vp, dloss);
  expect_ok(check_gradient(logits, dlogits, loss, all_indices(logits.size())), "dlogits");
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) EXPECT_EQ(dlogits[n * Vp + j], 0.0f);
}

TEST_F(OpsGradTest, AddAndAccumulate) {
  const std::size_t n = 10;
  std::vector<float> a = randn(n, 80), b = randn(n, 81);
  const std::vector<float> R = randn(n, 82);
  std::vector<float> out(n);
  auto loss = [&] {
    ops->add(out.data(), a.data(), b.data(), n);
    return dot(out, R);
  };
  const std::vector<float>& da = R;  // d(a + b)/da = identity: da = dout
  expect_ok(check_gradient(a, da, loss, all_indices(n)), "add da");
  expect_ok(check_gradient(b, da, loss, all_indices(n)), "add db");
}

}  // namespace
}  // namespace pptrain::ops
