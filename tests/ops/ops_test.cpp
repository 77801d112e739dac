// Forward results and call semantics of the CPU backend: GEMM against a naive loop,
// reference values, accumulate-vs-overwrite, aliasing, causality and determinism.
#include "ops/cpu/cpu_ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops_test_util.hpp"

namespace pptrain::ops {
namespace {

using testing::randn;

class OpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<CpuOps> ops = std::make_unique<CpuOps>(1);
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ops.gemm of random A, B and C (NaN garbage when beta is 0) against a double loop, for
// every transpose, within the forward-error bound of any order of summation: K products
// and sums, then alpha and beta, each rounded once, so gamma(K + 2) of the absolute terms
// (gamma(n) = n u / (1 - n u), u = 2^-24).
void expect_gemm_matches_naive_loop(CpuOps& ops, int M, int N, int K, float alpha, float beta) {
  const double u = std::ldexp(1.0, -24), gamma = (K + 2) * u / (1 - (K + 2) * u);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::vector<float> A = randn(M * K, 1), B = randn(K * N, 2), C0 = randn(M * N, 3);
      std::vector<float> C = beta != 0.0f ? C0 : std::vector<float>(M * N, std::nanf(""));
      ops.gemm(ta, tb, M, N, K, alpha, A.data(), B.data(), beta, C.data());
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double s = 0, abs_terms = 0;
          for (int k = 0; k < K; ++k) {
            const double p =
                double(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
            s += p;
            abs_terms += std::abs(p);
          }
          const double c0 = beta != 0.0f ? C0[i * N + j] : 0.0;
          const double bound = gamma * (std::abs(alpha) * abs_terms + std::abs(beta * c0));
          EXPECT_NEAR(C[i * N + j], alpha * s + beta * c0, bound)
              << "K=" << K << " ta=" << ta << " tb=" << tb << " beta=" << beta << " at " << i
              << "," << j;
        }
    }
}

TEST_F(OpsTest, GemmMatchesNaiveLoopForAllTransposes) {
  expect_gemm_matches_naive_loop(*ops, 5, 7, 3, 0.7f, 0.3f);
}

// A K of several blocks (ops/cpu/cpu_gemm.hpp), the last one partial.
TEST_F(OpsTest, LongKGemmMatchesNaiveLoopForAllTransposes) {
  for (float beta : {0.0f, 0.3f})  // K 603: two blocks of 256 and one of 91
    expect_gemm_matches_naive_loop(*ops, 5, 7, 603, 0.7f, beta);
}

// The fused form runs the same GEMM and the same elementwise GELU backward, on tiles.
TEST(OpsFusion, LinearBackwardInputIsTheGemmThenTheGeluBackwardBitForBit) {
  for (int threads : {1, 2, 3})
    for (const auto& [N, Cin, Cout] : {std::tuple{74, 192, 48}, std::tuple{300, 70, 600}}) {
      CpuOps ops(threads);
      const std::vector<float> dout = randn(N * Cout, 1), w = randn(Cin * Cout, 2, 0.3f),
                               pre = randn(N * Cin, 3);
      std::vector<float> fused(N * Cin, std::nanf("")), parts(N * Cin, std::nanf(""));
      ops.linear_backward_input(fused.data(), dout.data(), w.data(), pre.data(), N, Cin, Cout);
      ops.gemm(false, true, N, Cin, Cout, 1.0f, dout.data(), w.data(), 0.0f, parts.data());
      ops.gelu_backward(parts.data(), pre.data(), parts.data(), parts.size());
      EXPECT_TRUE(same_bits(fused, parts)) << N << "x" << Cin << "x" << Cout << " on " << threads;
      ops.linear_backward_input(fused.data(), dout.data(), w.data(), nullptr, N, Cin, Cout);
      ops.gemm(false, true, N, Cin, Cout, 1.0f, dout.data(), w.data(), 0.0f, parts.data());
      EXPECT_TRUE(same_bits(fused, parts)) << "without GELU";
    }
}

// The weight and bias gradients together: the weight gradient is linear_weight_grad's,
// bit for bit; the bias sums (taken from the product's packed strips, per K block in
// double) are within a float rounding of the exact column sums, added to what dbias held,
// and the same bits on any thread count. Token counts of one, several and partial K blocks.
TEST(OpsFusion, LinearGradsIsTheWeightGradientAndTheColumnSums) {
  std::vector<float> first_bias;
  for (const auto& [N, Cin, Cout] :
       {std::tuple{600, 70, 300}, std::tuple{600, 300, 70}, std::tuple{37, 48, 40}})
    for (int threads : {1, 2, 3}) {
      CpuOps ops(threads);
      const std::vector<float> x = randn(N * Cin, 1), dout = randn(N * Cout, 2),
                               dw0 = randn(Cin * Cout, 3), db0 = randn(Cout, 4);
      std::vector<float> dw = dw0, db = db0, dw_alone = dw0;
      ops.linear_grads(dw.data(), db.data(), x.data(), dout.data(), N, Cin, Cout);
      ops.linear_weight_grad(dw_alone.data(), x.data(), dout.data(), N, Cin, Cout);
      const std::string what = std::to_string(N) + "x" + std::to_string(Cin) + "x" +
                               std::to_string(Cout) + " on " + std::to_string(threads);
      EXPECT_TRUE(same_bits(dw, dw_alone)) << what;
      for (int c = 0; c < Cout; ++c) {
        long double sum = 0;
        for (int n = 0; n < N; ++n) sum += dout[std::size_t(n) * Cout + c];
        const double exact = double(sum + db0[c]);
        // Two float roundings (the sum, then its addition to dbias), each within 2^-24 of
        // its value; the double sums' own error is below 1e-12 here.
        const double bound = std::ldexp(std::fabs(double(sum)) + std::fabs(exact), -24) + 1e-12;
        EXPECT_NEAR(db[c], exact, bound) << what << " column " << c;
      }
      if (threads == 1) first_bias = db;
      EXPECT_TRUE(same_bits(db, first_bias)) << what;
      std::vector<float> dw_only = dw0;
      ops.linear_grads(dw_only.data(), nullptr, x.data(), dout.data(), N, Cin, Cout);
      EXPECT_TRUE(same_bits(dw_only, dw_alone)) << "without a bias, " << what;
    }
}

// The projection with its residual adds the bias and the residual on each tile, as
// add_bias and add would after the GEMM: the same bits.
TEST(OpsFusion, GemmResidualIsTheGemmThenTheBiasThenTheResidualBitForBit) {
  for (int threads : {1, 2, 3})
    for (bool trans_b : {false, true})
      for (const auto& [M, N, K] : {std::tuple{74, 48, 192}, std::tuple{300, 96, 600}}) {
        CpuOps ops(threads);
        const std::vector<float> a = randn(M * K, 1), b = randn(K * N, 2, 0.3f),
                                 bias = randn(N, 3), res = randn(M * N, 4);
        std::vector<float> fused(M * N, std::nanf("")), parts(M * N, std::nanf(""));
        ops.gemm_residual(trans_b, M, N, K, a.data(), b.data(), bias.data(), res.data(),
                          fused.data());
        ops.gemm(false, trans_b, M, N, K, 1.0f, a.data(), b.data(), 0.0f, parts.data());
        ops.add_bias(parts.data(), bias.data(), M, N);
        for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = parts[i] + res[i];
        EXPECT_TRUE(same_bits(fused, parts)) << M << "x" << N << "x" << K << " on " << threads;
        ops.gemm_residual(trans_b, M, N, K, a.data(), b.data(), nullptr, res.data(), fused.data());
        ops.gemm(false, trans_b, M, N, K, 1.0f, a.data(), b.data(), 0.0f, parts.data());
        for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = parts[i] + res[i];
        EXPECT_TRUE(same_bits(fused, parts)) << "without bias";
      }
}

TEST_F(OpsTest, GemmWithBetaZeroOverwritesGarbage) {
  const int M = 3, N = 4, K = 2;
  const std::vector<float> A = randn(M * K, 4), B = randn(K * N, 5);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN());
  ops->gemm(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      EXPECT_NEAR(C[i * N + j], A[i * K] * B[j] + A[i * K + 1] * B[N + j], 1e-6);
}

TEST_F(OpsTest, AddBiasAndBiasBackwardAccumulate) {
  const int N = 3, C = 4;
  const std::vector<float> x = randn(N * C, 6), bias = randn(C, 7);
  std::vector<float> out = x;
  ops->add_bias(out.data(), bias.data(), N, C);
  ops->add_bias(out.data(), bias.data(), N, C);
  for (int i = 0; i < N * C; ++i) EXPECT_FLOAT_EQ(out[i], x[i] + 2 * bias[i % C]);
  std::vector<float> db(C, 1.0f);
  ops->bias_backward(db.data(), x.data(), N, C);
  ops->bias_backward(db.data(), x.data(), N, C);
  for (int c = 0; c < C; ++c) EXPECT_NEAR(db[c], 1.0f + 2 * (x[c] + x[C + c] + x[2 * C + c]), 1e-5);
}

TEST_F(OpsTest, LayerNormForwardMatchesDoubleReference) {
  const int N = 3, C = 10;
  std::vector<float> x = randn(N * C, 8, 3.0f), w = randn(C, 9), b = randn(C, 10);
  x[0] += 100.0f;
  std::vector<float> out(N * C), mean(N), rstd(N);
  ops->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double rs = 1.0 / std::sqrt(v / C + 1e-5);  // biased variance, eps 1e-5
    EXPECT_NEAR(mean[n], m, 1e-5 * std::fabs(m) + 1e-6);
    EXPECT_NEAR(rstd[n], rs, 1e-5 * rs);
    for (int c = 0; c < C; ++c)
      EXPECT_NEAR(out[n * C + c], (x[n * C + c] - m) * rs * w[c] + b[c], 1e-4);
  }
}

TEST_F(OpsTest, LayerNormBackwardAccumulates) {
  const int N = 2, C = 6;
  const std::vector<float> x = randn(N * C, 11), w = randn(C, 12), b = randn(C, 13),
                           d = randn(N * C, 14);
  std::vector<float> out(N * C), mean(N), rstd(N);
  ops->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  std::vector<float> dx1(N * C, 0.0f), dw1(C, 0.0f), db1(C, 0.0f);
  ops->layernorm_backward_input(dx1.data(), dx1.data(), d.data(), x.data(), w.data(), mean.data(),
                                rstd.data(), N, C);
  ops->layernorm_backward_weight(dw1.data(), db1.data(), d.data(), x.data(), mean.data(),
                                 rstd.data(), N, C);
  std::vector<float> dx2(N * C, 0.5f), dw2(C, 0.5f), db2(C, 0.5f);
  for (int rep = 0; rep < 2; ++rep) {
    ops->layernorm_backward_input(dx2.data(), dx2.data(), d.data(), x.data(), w.data(),
                                  mean.data(), rstd.data(), N, C);
    ops->layernorm_backward_weight(dw2.data(), db2.data(), d.data(), x.data(), mean.data(),
                                   rstd.data(), N, C);
  }
  for (int i = 0; i < N * C; ++i) EXPECT_NEAR(dx2[i], 0.5f + 2 * dx1[i], 1e-5);
  for (int c = 0; c < C; ++c) {
    EXPECT_NEAR(dw2[c], 0.5f + 2 * dw1[c], 1e-5);
    EXPECT_NEAR(db2[c], 0.5f + 2 * db1[c], 1e-5);
  }
}

TEST_F(OpsTest, GeluMatchesTanhFormula) {
  const std::vector<float> x = {-6.0f, -2.0f, -0.5f, 0.0f, 0.3f, 1.0f, 3.0f, 8.0f};
  std::vector<float> out(x.size());
  ops->gelu_forward(out.data(), x.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out[i], ref, 1e-6 + 1e-6 * std::fabs(ref)) << "x=" << v;
  }
  std::vector<float> d(x.size(), 1.0f);  // dinp may alias dout and overwrites
  ops->gelu_backward(d.data(), x.data(), d.data(), x.size());
  EXPECT_NEAR(d[3], 0.5f, 1e-7);
}

// Multi-head (NKV = NH) and grouped-query attention (NKV = 1) against the double
// reference.
TEST_F(OpsTest, AttentionMatchesReferenceAcrossRowBlocks) {
  for (int NKV : {2, 1}) {
    const int B = 2, T = 150, C = 16, NH = 2, W = C + 2 * (C / NH) * NKV;
    SCOPED_TRACE("NKV " + std::to_string(NKV));
    const std::vector<float> qkv = randn(B * T * W, 20), dout = randn(B * T * C, 21);
    std::vector<float> out(B * T * C), att(B * NH * T * T, 7.0f);
    ops->attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
    std::vector<double> rout, ratt;
    testing::reference_attention(rout, ratt, qkv, B, T, C, NH, NKV);
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], rout[i], 1e-5) << i;
    for (std::size_t i = 0; i < att.size(); ++i) ASSERT_NEAR(att[i], ratt[i], 1e-6) << i;
    for (int bh = 0; bh < B * NH; ++bh)
      for (int t = 0; t < T; ++t) {
        double row = 0;
        for (int j = 0; j < T; ++j) {
          const float a = att[(std::size_t(bh) * T + t) * T + j];
          if (j > t) {
            ASSERT_EQ(a, 0.0f) << "above the diagonal";
          }
          row += a;
        }
        ASSERT_NEAR(row, 1.0, 1e-5);
      }
    std::vector<float> dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
    ops->attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, NKV);
    const std::vector<double> ref =
        testing::reference_attention_backward(qkv, dout, B, T, C, NH, NKV);
    for (std::size_t i = 0; i < dqkv.size(); ++i) ASSERT_NEAR(dqkv[i], ref[i], 1e-4) << i;
  }
}

TEST_F(OpsTest, AttentionIsCausal) {
  const int B = 1, T = 9, C = 8, NH = 2, changed = 4;
  std::vector<float> qkv = randn(B * T * 3 * C, 22);
  std::vector<float> out1(B * T * C), out2(B * T * C), att(B * NH * T * T);
  ops->attention_forward(out1.data(), att.data(), qkv.data(), B, T, C, NH, NH);
  for (int c = C; c < 3 * C; ++c) qkv[changed * 3 * C + c] += 1.5f;  // token 4's k and v
  ops->attention_forward(out2.data(), att.data(), qkv.data(), B, T, C, NH, NH);
  for (int t = 0; t < T; ++t) {
    bool same = std::memcmp(&out1[t * C], &out2[t * C], C * sizeof(float)) == 0;
    EXPECT_EQ(same, t < changed) << "row " << t;
  }
}

TEST_F(OpsTest, EmbeddingForwardAndAccumulatingBackward) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> tokens = {4, 0, 4, 2, 2, 1};
  const std::vector<float> wte = randn(V * C, 23), wpe = randn(T * C, 24), d = randn(B * T * C, 25);
  std::vector<float> out(B * T * C);
  ops->embedding_forward(out.data(), tokens.data(), wte.data(), 0, V, wpe.data(), B, T, C);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(out[bt * C + c], wte[tokens[bt] * C + c] + wpe[(bt % T) * C + c]);
  std::vector<float> dwte(V * C, 1.0f), dwpe(T * C, 1.0f);
  ops->embedding_backward(dwte.data(), dwpe.data(), d.data(), tokens.data(), 0, V, B, T, C);
  for (int c = 0; c < C; ++c) {
    EXPECT_FLOAT_EQ(dwte[4 * C + c], 1.0f + d[0 * C + c] + d[2 * C + c]);
    EXPECT_FLOAT_EQ(dwte[3 * C + c], 1.0f);
    EXPECT_FLOAT_EQ(dwpe[1 * C + c], 1.0f + d[1 * C + c] + d[4 * C + c]);
  }
}

TEST_F(OpsTest, CrossEntropyHandComputedAndPadding) {
  // Row 0: logits (1, 2, 3), target 0: loss = log(e + e^2 + e^3) - 1.
  const int N = 2, V = 3, Vp = 5;
  const float big = 1e30f;
  std::vector<float> logits = {1, 2, 3, big, -big, 1000, 1001, 999, big, big};
  const std::vector<int32_t> targets = {0, 1};
  std::vector<float> losses(N), dl(N * Vp, 5.0f);
  ops->cross_entropy(losses.data(), dl.data(), logits.data(), targets.data(), N, V, Vp, 0.5f);
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 1.0;
  const double l1 = std::log(std::exp(-1.0) + 1.0 + std::exp(-2.0));  // stable at 1000
  EXPECT_NEAR(losses[0], l0, 1e-6);
  EXPECT_NEAR(losses[1], l1, 1e-6);
  EXPECT_NEAR(dl[0], 0.5 * (std::exp(1.0 - l0 - 1.0) - 1.0), 1e-6);
  EXPECT_NEAR(dl[2], 0.5 * std::exp(3.0 - l0 - 1.0), 1e-6);
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) EXPECT_EQ(dl[n * Vp + j], 0.0f);
  // Loss only, and in place (dlogits aliasing logits): same numbers.
  std::vector<float> only(N);
  ops->cross_entropy(only.data(), nullptr, logits.data(), targets.data(), N, V, Vp, 0.5f);
  EXPECT_EQ(only, losses);
  std::vector<float> inplace = logits, l2(N);
  ops->cross_entropy(l2.data(), inplace.data(), inplace.data(), targets.data(), N, V, Vp, 0.5f);
  EXPECT_EQ(l2, losses);
  EXPECT_TRUE(same_bits(inplace, dl));
}

TEST_F(OpsTest, CrossEntropyRejectsTargetsOutsideVocab) {
  std::vector<float> logits(8, 0.0f), losses(1);
  for (int32_t bad : {-1, 6, 7}) {
    EXPECT_THROW(ops->cross_entropy(losses.data(), nullptr, logits.data(), &bad, 1, 6, 8, 1.0f),
                 std::logic_error)
        << bad;
  }
}

TEST_F(OpsTest, AddAliases) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  ops->add(a.data(), a.data(), b.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));
  ops->add(b.data(), a.data(), b.data(), 3);
  EXPECT_EQ(b, (std::vector<float>{21, 42, 63}));
}

// Same inputs, same bits, every call (here with two GEMM threads).
TEST(OpsDeterminism, RepeatedCallsAreBitIdentical) {
  auto ops = std::make_unique<CpuOps>(2);
  const int B = 2, T = 70, C = 32, NH = 4, V = 50, Vp = 64;
  const std::vector<float> qkv = randn(B * T * 3 * C, 30), dout = randn(B * T * C, 31);
  const std::vector<float> logits = randn(B * T * Vp, 32);
  std::vector<int32_t> targets(B * T);
  for (int i = 0; i < B * T; ++i) targets[i] = (i * 7) % V;
  std::vector<float> first;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(qkv.size()), losses(B * T),
        dl(logits.size()), w(C * C, 0.0f), g(C * C);
    ops->attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NH);
    ops->attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, NH);
    ops->cross_entropy(losses.data(), dl.data(), logits.data(), targets.data(), B * T, V, Vp, 1.0f);
    ops->gemm(true, false, C, C, B * T, 1.0f, out.data(), dout.data(), 0.0f, g.data());
    std::vector<float> all;
    for (const auto* v : {&out, &att, &dqkv, &losses, &dl, &g})
      all.insert(all.end(), v->begin(), v->end());
    if (rep == 0) {
      first = all;
    } else {
      EXPECT_TRUE(same_bits(all, first)) << "repeat " << rep;
    }
  }
}

// Every op with shapes that take its threaded paths (several row, element, column and
// norm blocks; GEMMs that OpenBLAS would thread), on 1, 2 and 3 threads: the same bits.
// GEMMs threaded by OpenBLAS itself differed in the last bits (its kernels for an AVX2
// AMD Zen CPU).
TEST(OpsDeterminism, ThreadCountDoesNotChangeAnyBit) {
  const int B = 4, T = 64, C = 192, NH = 4, N = B * T, V = 250, Vp = 256;
  const std::vector<float> x = randn(N * 4 * C, 40), y = randn(N * 4 * C, 41);
  const std::vector<float> w = randn(C * 4 * C, 42, 0.1f), c0 = randn(N * 4 * C, 43);
  const std::vector<float> ln_w = randn(C, 44), ln_b = randn(C, 45);
  const std::vector<float> qkv = randn(N * 3 * C, 46), logits = randn(N * Vp, 47, 2.0f);
  std::vector<int32_t> tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = (i * 37) % V;

  // Each op's outputs, named, on one thread count.
  auto run = [&](int threads) {
    CpuOps ops(threads);
    std::vector<std::pair<std::string, std::vector<float>>> out;
    // The second shape's K is 48 times its output's side: many K blocks (as the tied head's
    // input gradient).
    struct Shape {
      const char* name;
      int M, N, K;
      const float* B;
    };
    const Shape shapes[] = {{"gemm", N, C, C, w.data()},
                            {"long-K gemm", 64, 64, N * 4 * C / 64, y.data()}};
    for (const Shape& g : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (float beta : {0.0f, 1.0f}) {
            std::vector<float> c(c0.begin(), c0.begin() + g.M * g.N);
            ops.gemm(ta, tb, g.M, g.N, g.K, 0.5f, x.data(), g.B, beta, c.data());
            out.emplace_back(std::string(g.name) + " ta " + std::to_string(ta) + " tb " +
                                 std::to_string(tb) + (beta != 0.0f ? " beta 1" : " beta 0"),
                             c);
          }
    std::vector<float> lin(N * 4 * C), lin_gelu(N * 4 * C);
    ops.linear_forward(lin.data(), lin_gelu.data(), x.data(), w.data(), c0.data(), N, C, 4 * C);
    out.emplace_back("linear_forward", lin);
    out.emplace_back("linear_forward gelu", lin_gelu);
    std::vector<float> lin_dinp(N * 4 * C);
    ops.linear_backward_input(lin_dinp.data(), x.data(), w.data(), y.data(), N, 4 * C, C);
    out.emplace_back("linear_backward_input gelu", lin_dinp);
    std::vector<float> dw(c0.begin(), c0.begin() + 3 * C * C);
    ops.linear_weight_grad(dw.data(), x.data(), y.data(), N, C, 3 * C);
    out.emplace_back("linear_weight_grad", dw);
    std::vector<float> db(c0.begin(), c0.begin() + 4 * C);
    ops.bias_backward(db.data(), y.data(), N, 4 * C);
    out.emplace_back("bias_backward", db);

    std::vector<float> ln(N * C), mean(N), rstd(N), dx(c0.begin(), c0.begin() + N * C);
    std::vector<float> dlw(C, 0.0f), dlb(C, 0.0f);
    ops.layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), ln_w.data(),
                          ln_b.data(), N, C);
    ops.layernorm_backward_input(dx.data(), dx.data(), y.data(), x.data(), ln_w.data(),
                                 mean.data(), rstd.data(), N, C);
    ops.layernorm_backward_weight(dlw.data(), dlb.data(), y.data(), x.data(), mean.data(),
                                  rstd.data(), N, C);
    out.emplace_back("layernorm_forward", ln);
    out.emplace_back("layernorm_forward mean", mean);
    out.emplace_back("layernorm_forward rstd", rstd);
    out.emplace_back("layernorm_backward_input", dx);
    out.emplace_back("layernorm_backward_weight dw", dlw);
    out.emplace_back("layernorm_backward_weight db", dlb);

    std::vector<float> g(x.size()), dg(x.size()), sum(x.size());
    ops.gelu_forward(g.data(), x.data(), x.size());
    ops.gelu_backward(dg.data(), x.data(), y.data(), x.size());
    ops.add(sum.data(), x.data(), y.data(), x.size());
    out.emplace_back("gelu_forward", g);
    out.emplace_back("gelu_backward", dg);
    out.emplace_back("add", sum);

    // Multi-head and grouped-query (two key/value heads: qkv's first N * 2C elements).
    for (int NKV : {NH, 2})
      for (bool blocked : {false, true}) {
        std::vector<float> o(N * C), state(blocked ? B * NH * T : B * NH * T * T);
        std::vector<float> dqkv(std::size_t(N) * (C + 2 * (C / NH) * NKV), 0.0f);
        if (blocked) {
          ops.attention_forward_blocked(o.data(), state.data(), qkv.data(), B, T, C, NH, NKV);
          ops.attention_backward_blocked(dqkv.data(), y.data(), qkv.data(), o.data(),
                                         state.data(), B, T, C, NH, NKV);
        } else {
          ops.attention_forward(o.data(), state.data(), qkv.data(), B, T, C, NH, NKV);
          ops.attention_backward(dqkv.data(), y.data(), qkv.data(), state.data(), B, T, C, NH,
                                 NKV);
        }
        const std::string kv = " NKV " + std::to_string(NKV);
        out.emplace_back((blocked ? "attention_forward_blocked" : "attention_forward") + kv, o);
        out.emplace_back((blocked ? "attention_backward_blocked" : "attention_backward") + kv,
                         dqkv);
      }

    std::vector<float> losses(N), dlogits(logits.size());
    ops.cross_entropy(losses.data(), dlogits.data(), logits.data(), tokens.data(), N, V, Vp,
                      1.0f / N);
    out.emplace_back("cross_entropy losses", losses);
    out.emplace_back("cross_entropy dlogits", dlogits);

    std::vector<float> emb(N * C), dwte(Vp * C, 0.0f), dwpe(T * C, 0.0f);
    ops.embedding_forward(emb.data(), tokens.data(), x.data(), 0, Vp, y.data(), B, T, C);
    ops.embedding_backward(dwte.data(), dwpe.data(), x.data(), tokens.data(), 0, Vp, B, T, C);
    out.emplace_back("embedding_forward", emb);
    out.emplace_back("embedding_backward dwte", dwte);
    out.emplace_back("embedding_backward dwpe", dwpe);

    const double sq = ops.sum_squares({{x.data(), x.size()}, {y.data(), y.size()}});
    std::vector<float> sq_bits(2);
    std::memcpy(sq_bits.data(), &sq, sizeof sq);
    out.emplace_back("sum_squares", sq_bits);

    std::vector<float> p(w), m(w.size(), 0.01f), v(w.size(), 0.001f);
    const AdamWStep h{1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.1f, 10.0f, 20.0f, 0.5f};
    ops.adamw(p.data(), nullptr, y.data(), m.data(), v.data(), p.size(), h);
    out.emplace_back("adamw params", p);
    out.emplace_back("adamw m", m);
    out.emplace_back("adamw v", v);
    return out;
  };

  const auto one = run(1);
  for (int threads : {2, 3}) {
    const auto many = run(threads);
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(same_bits(many[i].second, one[i].second))
          << one[i].first << " on " << threads << " threads";
  }
}

}  // namespace
}  // namespace pptrain::ops
