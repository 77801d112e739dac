// The op table's cases (op_table.hpp): one per op of ops::Ops, with its shapes and
// tolerances; variants (transposes, aliasing, optional arguments) are cases of their own.
// Shapes are small and odd, with some that take the CUDA kernels' 16-byte paths.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/random.hpp"
#include "op_table.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops::testing {
namespace {

// An Act output: one rounding to bf16; an fp32 sum or statistic: fp32 arithmetic.
constexpr Tolerance kAct{1e-5, 1e-2}, kSum{1e-5, 1e-4};

// n ids in [0, bound), a pure function of seed.
std::vector<int32_t> ids(std::size_t n, uint64_t seed, int bound) {
  std::vector<int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = int32_t(uniform01(hash_words(seed, i)) * bound);
  return v;
}

// The rows' mean and 1/sqrt(var + 1e-5) of x[N,C], in double: LayerNorm's saved statistics.
void row_stats(const std::vector<float>& x, int N, int C, std::vector<float>& mean,
               std::vector<float>& rstd) {
  mean.resize(N), rstd.resize(N);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[std::size_t(n) * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += std::pow(x[std::size_t(n) * C + c] - m, 2);
    mean[n] = float(m), rstd[n] = float(1.0 / std::sqrt(v / C + 1e-5));
  }
}

void add_gemm_cases(std::vector<OpCase>& t) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.5f})
        t.push_back({"gemm_ta" + std::to_string(ta) + "_tb" + std::to_string(tb) +
                         (beta != 0.0f ? "_beta" : "_nobeta"),
                     [=](OpRun& r) {
                       const int M = 37, N = 48, K = 17;
                       const Act *a = r.act(r.randn(M * K, 1)), *b = r.act(r.randn(K * N, 2));
                       Act* c = beta != 0.0f ? r.act_inout("C", r.randn(M * N, 3), kAct)
                                             : r.act_out("C", M * N, kAct);
                       r.ops.gemm(ta, tb, M, N, K, 0.75f, a, b, beta, c);
                     }});
  // K at least twice the output's sides: the CPU backend splits K into parts.
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      t.push_back({"gemm_long_k_ta" + std::to_string(ta) + "_tb" + std::to_string(tb),
                   [=](OpRun& r) {
                     const int M = 9, N = 12, K = 301;
                     const Act *a = r.act(r.randn(M * K, 1)), *b = r.act(r.randn(K * N, 2));
                     Act* c = r.act_inout("C", r.randn(M * N, 3), kAct);
                     r.ops.gemm(ta, tb, M, N, K, 0.75f, a, b, 0.5f, c);
                   }});
  // 101 columns: no bias+GELU epilogue on CUDA (its aux ld % 8), which falls back.
  for (int Cout : {192, 101})
    for (bool bias : {true, false})
      for (bool gelu : {true, false})
        t.push_back({"linear_forward_" + std::to_string(Cout) + (bias ? "_bias" : "") +
                         (gelu ? "_gelu" : ""),
                     [=](OpRun& r) {
                       const int N = 74, Cin = 48;
                       const std::size_t n = std::size_t(N) * Cout;
                       const Act *x = r.act(r.randn(N * Cin, 1)),
                                 *w = r.act(r.randn(Cin * Cout, 2, 0.3f)),
                                 *b = r.act(r.randn(Cout, 3));
                       Act* out = r.act_out("out", n, kAct);
                       Act* g = gelu ? r.act_out("gelu_out", n, kAct) : nullptr;
                       r.ops.linear_forward(out, g, x, w, bias ? b : nullptr, N, Cin, Cout);
                     }});
  // A projection with its residual: with and without bias, weight stored either way.
  for (bool trans_b : {false, true})
    for (bool bias : {true, false})
      t.push_back({std::string("gemm_residual") + (trans_b ? "_tb" : "") + (bias ? "_bias" : ""),
                   [=](OpRun& r) {
                     const int M = 74, N = 48, K = 96;
                     const Act *a = r.act(r.randn(M * K, 1)), *b = r.act(r.randn(K * N, 2, 0.3f)),
                               *bv = r.act(r.randn(N, 3)), *res = r.act(r.randn(M * N, 4));
                     r.ops.gemm_residual(trans_b, M, N, K, a, b, bias ? bv : nullptr, res,
                                         r.act_out("D", std::size_t(M) * N, kAct));
                   }});
  for (bool gelu : {true, false})
    t.push_back({std::string("linear_backward_input") + (gelu ? "_gelu" : ""), [=](OpRun& r) {
                   const int N = 74, Cin = 192, Cout = 48;
                   const Act *dout = r.act(r.randn(N * Cout, 1)),
                             *w = r.act(r.randn(Cin * Cout, 2, 0.3f)),
                             *pre = r.act(r.randn(N * Cin, 3));
                   Act* dinp = r.act_out("dinp", std::size_t(N) * Cin, kAct);
                   r.ops.linear_backward_input(dinp, dout, w, gelu ? pre : nullptr, N, Cin, Cout);
                 }});
}

void add_embedding_and_loss_cases(std::vector<OpCase>& t) {
  constexpr int B = 2, T = 37, C = 48, N = B * T, V = 101, Vp = 128;
  constexpr int begin = 40, rows = 30;  // the shard holds token rows [40, 70)
  auto tokens = [] {
    std::vector<int32_t> v = ids(N, 1, V);
    v[0] = begin, v[1] = begin + rows - 1, v[2] = begin + rows, v[3] = 0;
    v[5] = v[9] = v[40] = 55;  // a repeated token
    return v;
  };
  for (bool wpe : {true, false}) {
    const std::string with = wpe ? "_wpe" : "";
    t.push_back({"embedding_forward" + with, [=](OpRun& r) {
                   const Act* pos = r.act(r.randn(T * C, 3));
                   r.ops.embedding_forward(r.act_out("out", N * C, kAct), r.i32(tokens()),
                                           r.act(r.randn(rows * C, 2)), begin, rows,
                                           wpe ? pos : nullptr, B, T, C);
                 }});
    // Without wpe, dwpe stays as it was.
    t.push_back({"embedding_backward" + with, [=](OpRun& r) {
                   float* dwte = r.f32_inout("dwte", randn(rows * C, 5), kSum);
                   float* dwpe = r.f32_inout("dwpe", randn(T * C, 6), kSum);
                   r.ops.embedding_backward(dwte, wpe ? dwpe : nullptr, r.act(r.randn(N * C, 4)),
                                            r.i32(tokens()), begin, rows, B, T, C);
                 }});
  }
  // Gradient into its own array, in place over the logits, or none (the loss only).
  for (const std::string mode : {"", "_in_place", "_loss_only"})
    t.push_back({"cross_entropy" + mode, [=](OpRun& r) {
                   const std::vector<float> logits = r.randn(N * Vp, 1, 2.0f);
                   float* losses = r.f32_out("losses", N, kSum);
                   Act* dlogits = mode == "_in_place" ? r.act_inout("dlogits", logits, kAct)
                                  : mode.empty()      ? r.act_out("dlogits", N * Vp, kAct)
                                                      : nullptr;
                   const Act* in = mode == "_in_place" ? dlogits : r.act(logits);
                   r.ops.cross_entropy(losses, dlogits, in, r.i32(ids(N, 2, V)), N, V, Vp,
                                       1.0f / N);
                 }});
}

// The three vocab-parallel phases over four column shards of 32; with V = 60 the last two
// shards hold padding only. Each phase gets the statistics of the ones before from the host.
void add_vocab_parallel_cases(std::vector<OpCase>& t) {
  constexpr int N = 74, Vp = 128, shards = 4, Vl = Vp / shards;
  for (int V : {101, 60}) {
    struct Shards {
      std::vector<std::vector<float>> logits;
      std::vector<float> rowmax, stats;  // over all shards
      std::vector<int32_t> targets;
    };
    auto make = [=](const OpRun& r) {
      const std::vector<float> all = r.randn(std::size_t(N) * Vp, 3, 2.0f);
      Shards s{{}, std::vector<float>(N, -INFINITY), std::vector<float>(2 * N, 0.0f), ids(N, 4, V)};
      for (int k = 0; k < shards; ++k) {
        s.logits.emplace_back(std::size_t(N) * Vl);
        for (int n = 0; n < N; ++n)
          std::copy_n(&all[std::size_t(n) * Vp + k * Vl], Vl, &s.logits[k][std::size_t(n) * Vl]);
      }
      for (int n = 0; n < N; ++n)
        for (int j = 0; j < V; ++j)
          s.rowmax[n] = std::max(s.rowmax[n], all[std::size_t(n) * Vp + j]);
      for (int n = 0; n < N; ++n) {
        double sum = 0;
        for (int j = 0; j < V; ++j)
          sum += std::exp(double(all[std::size_t(n) * Vp + j]) - s.rowmax[n]);
        s.stats[2 * n] = float(sum), s.stats[2 * n + 1] = all[std::size_t(n) * Vp + s.targets[n]];
      }
      return s;
    };
    const std::string v = "_V" + std::to_string(V);
    // Phase 1's stats are the backend's own: compared after phase 2.
    const auto own_stats = [=](OpRun& r) { return static_cast<float*>(r.scratch(2 * N * 4)); };
    t.push_back({"ce_row_max" + v, [=](OpRun& r) {
                   const Shards s = make(r);
                   for (int k = 0; k < shards; ++k)
                     r.ops.ce_row_max(r.f32_out("rowmax " + std::to_string(k), N, {1e-6, 1e-6}),
                                      own_stats(r), r.act(s.logits[k]), N, Vl, k * Vl, V);
                 }});
    t.push_back({"ce_partial_sums" + v, [=](OpRun& r) {
                   const Shards s = make(r);
                   for (int k = 0; k < shards; ++k) {
                     float* stats = r.f32_out("stats " + std::to_string(k), 2 * N, kSum);
                     const Act* logits = r.act(s.logits[k]);
                     r.ops.ce_row_max(static_cast<float*>(r.scratch(N * 4)), stats, logits, N, Vl,
                                      k * Vl, V);
                     r.ops.ce_partial_sums(stats, logits, r.f32(s.rowmax), r.i32(s.targets), N,
                                           Vl, k * Vl, V);
                   }
                 }});
    t.push_back({"ce_finish" + v, [=](OpRun& r) {
                   const Shards s = make(r);
                   for (int k = 0; k < shards; ++k) {
                     const std::string shard = std::to_string(k);
                     r.ops.ce_finish(r.f32_out("losses " + shard, N, kSum),
                                     r.act_out("dlogits " + shard, N * Vl, kAct),
                                     r.act(s.logits[k]), r.f32(s.rowmax), r.f32(s.stats),
                                     r.i32(s.targets), N, Vl, k * Vl, V, 0.5f);
                   }
                 }});
  }
}

std::vector<OpCase> make_cases() {
  std::vector<OpCase> t;
  for (bool weights : {true, false})
    t.push_back({weights ? "adamw" : "adamw_no_weight_copy", [=](OpRun& r) {
                   const std::size_t n = 3001;
                   const AdamWStep h{1e-3f,
                                     0.9f,
                                     0.95f,
                                     0.1f,
                                     0.05f,
                                     1e-8f,
                                     0.1f,
                                     1.0f / (1 - 0.9f * 0.9f),
                                     1.0f / (1 - 0.95f * 0.95f),
                                     0.5f};
                   std::vector<float> v = randn(n, 4);
                   for (float& x : v) x = x * x * 0.01f;
                   float* p = r.f32_inout("params", randn(n, 1), {1e-5, 1e-5});
                   float* m = r.f32_inout("m", randn(n, 3, 0.1f), {1e-5, 1e-5});
                   float* s = r.f32_inout("v", v, {1e-5, 1e-5});
                   Act* w = weights ? r.act_out("weights", n, kAct) : nullptr;
                   r.ops.adamw(p, w, r.f32(randn(n, 2)), m, s, n, h);
                 }});
  t.push_back({"adamw_controlled", [](OpRun& r) {
                 const std::size_t n = 1001;
                 const float control[2] = {0.25f, 1.0f};
                 AdamWStep h{1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.1f, 2.0f, 3.0f, 0.5f};
                 h.control = r.f32({control[0], control[1]});
                 float* p = r.f32_inout("params", randn(n, 1), {1e-5, 1e-5});
                 float* m = r.f32_inout("m", randn(n, 3, 0.1f), {1e-5, 1e-5});
                 std::vector<float> v = randn(n, 4);
                 for (float& x : v) x = x * x * 0.01f;
                 float* s = r.f32_inout("v", v, {1e-5, 1e-5});
                 r.ops.adamw(p, nullptr, r.f32(randn(n, 2)), m, s, n, h);
               }});
  t.push_back({"adamw_skipped", [](OpRun& r) {
                 const std::size_t n = 77;
                 AdamWStep h{1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.1f, 2.0f, 3.0f, 0.5f};
                 h.control = r.f32({1.0f, 0.0f});
                 float* p = r.f32_inout("params", randn(n, 1), {0, 0});
                 float* m = r.f32_inout("m", randn(n, 3, 0.1f), {0, 0});
                 r.ops.adamw(p, r.act_inout("weights", randn(n, 5), {0, 0}), r.f32(randn(n, 2)), m,
                             r.f32_inout("v", randn(n, 4, 0.1f), {0, 0}), n, h);
               }});
  t.push_back({"sum_squares_to", [](OpRun& r) {
                 const std::vector<float> a = randn(70001, 1), b = randn(3, 2);
                 double* out = r.f64_inout("sum", {-1.0}, {1e-12, 1e-12});
                 r.ops.sum_squares_to(out, {{r.f32(a), a.size()}, {r.f32(b), b.size()}});
               }});
  t.push_back({"add_mean", [](OpRun& r) {
                 const std::vector<float> x = randn(4099, 1);
                 double* total = r.f64_inout("total", {0.75}, {1e-7, 1e-7});
                 r.ops.add_mean(total, r.f32(x), x.size());
               }});
  // Clipping off, clipping (norm sqrt(7) > 0.5), below the limit; a non-finite loss.
  for (const auto& [name, clip] : {std::pair<const char*, double>{"off", 0.0}, {"clipped", 0.5},
                                   {"below", 1e9}})
    t.push_back({std::string("update_control_") + name, [clip = clip](OpRun& r) {
                   r.ops.update_control(r.f32_out("control", 2, {0, 0}), r.f64({2.5, 7.0}), clip);
                 }});
  t.push_back({"update_control_nonfinite", [](OpRun& r) {
                 r.ops.update_control(r.f32_out("control", 2, {0, 0}), r.f64({NAN, 7.0}), 1.0);
               }});
  add_gemm_cases(t);
  t.push_back({"linear_weight_grad", [](OpRun& r) {
                 const int N = 74, Cin = 48, Cout = 101;
                 float* dw = r.f32_inout("dw", randn(Cin * Cout, 3), kSum);
                 r.ops.linear_weight_grad(dw, r.act(r.randn(N * Cin, 1)),
                                          r.act(r.randn(N * Cout, 2)), N, Cin, Cout);
               }});
  // Weight and bias gradients together (the CUDA backend's BGRAD epilogue), and without bias.
  for (bool bias : {true, false})
    t.push_back({std::string("linear_grads") + (bias ? "" : "_no_bias"), [=](OpRun& r) {
                   const int N = 74, Cin = 48, Cout = 101;
                   float* dw = r.f32_inout("dw", randn(Cin * Cout, 3), kSum);
                   float* db = bias ? r.f32_inout("dbias", randn(Cout, 4), kSum) : nullptr;
                   r.ops.linear_grads(dw, db, r.act(r.randn(N * Cin, 1)),
                                      r.act(r.randn(N * Cout, 2)), N, Cin, Cout);
                 }});
  t.push_back({"add_bias", [](OpRun& r) {
                 const int N = 74, C = 101;
                 r.ops.add_bias(r.act_inout("out", r.randn(N * C, 1), kAct), r.act(r.randn(C, 2)),
                                N, C);
               }});
  t.push_back({"bias_backward", [](OpRun& r) {
                 const int N = 74, C = 101;
                 r.ops.bias_backward(r.f32_inout("dbias", randn(C, 4), kSum),
                                     r.act(r.randn(N * C, 3)), N, C);
               }});
  constexpr int kN = 74, kC = 48;  // LayerNorm rows and width
  // A norm backward's arguments: its input gradient (the residual's gradient added from an
  // array of its own, or in place), the output gradient and the weight.
  struct NormGrads {
    Act* dinp;
    const Act* residual;
    const Act* dout;
    const Act* w;
  };
  auto norm_grads = [](OpRun& r, bool in_place) {
    const std::vector<float> dres = r.randn(kN * kC, 5);
    Act* dinp = in_place ? r.act_inout("dinp", dres, {1e-5, 2e-2})
                         : r.act_out("dinp", kN * kC, {1e-5, 2e-2});
    return NormGrads{dinp, in_place ? dinp : r.act(dres), r.act(r.randn(kN * kC, 4)),
                     r.act(r.randn(kC, 2))};
  };
  t.push_back({"layernorm_forward", [](OpRun& r) {
                 Act* out = r.act_out("out", kN * kC, kAct);
                 float* mean = r.f32_out("mean", kN, kSum);
                 float* rstd = r.f32_out("rstd", kN, kSum);
                 r.ops.layernorm_forward(out, mean, rstd, r.act(r.randn(kN * kC, 1, 2.0f)),
                                         r.act(r.randn(kC, 2)), r.act(r.randn(kC, 3)), kN, kC);
               }});
  // The residual's gradient added from an array of its own, or in place (dinp += ...);
  // alone, or with the weight gradients in the same call (B and W together).
  for (bool with_weights : {false, true})
    for (bool in_place : {false, true})
      t.push_back({std::string(with_weights ? "layernorm_backward" : "layernorm_backward_input") +
                       (in_place ? "_in_place" : ""),
                   [=](OpRun& r) {
                     const std::vector<float> x = r.randn(kN * kC, 1, 2.0f);
                     std::vector<float> mean, rstd;
                     row_stats(x, kN, kC, mean, rstd);
                     const NormGrads g = norm_grads(r, in_place);
                     if (!with_weights) {
                       r.ops.layernorm_backward_input(g.dinp, g.residual, g.dout, r.act(x), g.w,
                                                      r.f32(mean), r.f32(rstd), kN, kC);
                       return;
                     }
                     float* dw = r.f32_inout("dw", randn(kC, 6), kSum);
                     float* db = r.f32_inout("db", randn(kC, 7), kSum);
                     r.ops.layernorm_backward(g.dinp, g.residual, g.dout, r.act(x), g.w,
                                              r.f32(mean), r.f32(rstd), dw, db, kN, kC);
                   }});
  t.push_back({"layernorm_backward_weight", [](OpRun& r) {
                 const std::vector<float> x = r.randn(kN * kC, 1, 2.0f);
                 std::vector<float> mean, rstd;
                 row_stats(x, kN, kC, mean, rstd);
                 float* dw = r.f32_inout("dw", randn(kC, 6), kSum);
                 float* db = r.f32_inout("db", randn(kC, 7), kSum);
                 r.ops.layernorm_backward_weight(dw, db, r.act(r.randn(kN * kC, 4)), r.act(x),
                                                 r.f32(mean), r.f32(rstd), kN, kC);
               }});
  // RMSNorm at Llama's eps; its rows' 1/rms for the backward, in double.
  constexpr float kRmsEps = 1e-6f;
  auto rms_stats = [](const std::vector<float>& x) {
    std::vector<float> rstd(kN);
    for (int n = 0; n < kN; ++n) {
      double sq = 0;
      for (int c = 0; c < kC; ++c) sq += std::pow(x[std::size_t(n) * kC + c], 2);
      rstd[n] = float(1.0 / std::sqrt(sq / kC + kRmsEps));
    }
    return rstd;
  };
  t.push_back({"rmsnorm_forward", [](OpRun& r) {
                 Act* out = r.act_out("out", kN * kC, kAct);
                 float* rstd = r.f32_out("rstd", kN, kSum);
                 r.ops.rmsnorm_forward(out, rstd, r.act(r.randn(kN * kC, 1, 2.0f)),
                                       r.act(r.randn(kC, 2)), kN, kC, kRmsEps);
               }});
  // As LayerNorm's: in place or apart, alone or with the weight gradient.
  for (bool with_weights : {false, true})
    for (bool in_place : {false, true})
      t.push_back({std::string(with_weights ? "rmsnorm_backward" : "rmsnorm_backward_input") +
                       (in_place ? "_in_place" : ""),
                   [=](OpRun& r) {
                     const std::vector<float> x = r.randn(kN * kC, 1, 2.0f);
                     const NormGrads g = norm_grads(r, in_place);
                     if (!with_weights) {
                       r.ops.rmsnorm_backward_input(g.dinp, g.residual, g.dout, r.act(x), g.w,
                                                    r.f32(rms_stats(x)), kN, kC);
                       return;
                     }
                     float* dw = r.f32_inout("dw", randn(kC, 6), kSum);
                     r.ops.rmsnorm_backward(g.dinp, g.residual, g.dout, r.act(x), g.w,
                                            r.f32(rms_stats(x)), dw, kN, kC);
                   }});
  t.push_back({"rmsnorm_backward_weight", [=](OpRun& r) {
                 const std::vector<float> x = r.randn(kN * kC, 1, 2.0f);
                 float* dw = r.f32_inout("dw", randn(kC, 6), kSum);
                 r.ops.rmsnorm_backward_weight(dw, r.act(r.randn(kN * kC, 4)), r.act(x),
                                               r.f32(rms_stats(x)), kN, kC);
               }});
  constexpr int kF = 37;  // SwiGLU's hidden columns: odd
  t.push_back({"swiglu_forward", [](OpRun& r) {
                 r.ops.swiglu_forward(r.act_out("out", kN * kF, kAct),
                                      r.act(r.randn(kN * 2 * kF, 1, 3.0f)), kN, kF);
               }});
  t.push_back({"swiglu_backward", [](OpRun& r) {
                 r.ops.swiglu_backward(r.act_out("dgate_up", kN * 2 * kF, kAct),
                                       r.act(r.randn(kN * kF, 2)),
                                       r.act(r.randn(kN * 2 * kF, 1, 3.0f)), kN, kF);
               }});
  // Rows of 3 rotated heads of 16 and 2 heads left as they are (v), positions up to 36;
  // and a piece of the sequence from position 4000 (context parallelism).
  for (bool inverse : {false, true})
    for (int first : {0, 4000})
      t.push_back({std::string(inverse ? "rope_inverse" : "rope") + (first ? "_piece" : ""),
                   [=](OpRun& r) {
                     const int stride = 5 * 16;
                     r.ops.rope(r.act_inout("x", r.randn(kN * stride, 1), kAct), kN, 37, stride, 3,
                                16, 10000.0f, inverse, first);
                   }});
  constexpr std::size_t kGelu = 5001;
  t.push_back({"gelu_forward", [](OpRun& r) {
                 r.ops.gelu_forward(r.act_out("out", kGelu, kAct), r.act(r.randn(kGelu, 1, 3.0f)),
                                    kGelu);
               }});
  for (bool in_place : {false, true})  // in place: dinp aliases dout
    t.push_back({in_place ? "gelu_backward_in_place" : "gelu_backward", [=](OpRun& r) {
                   const Act* x = r.act(r.randn(kGelu, 1, 3.0f));
                   const std::vector<float> dy = r.randn(kGelu, 2);
                   Act* dinp =
                       in_place ? r.act_inout("dinp", dy, kAct) : r.act_out("dinp", kGelu, kAct);
                   r.ops.gelu_backward(dinp, x, in_place ? dinp : r.act(dy), kGelu);
                 }});
  // Attention forward, then the backward from the backend's own state; T and the head
  // size multiples of 8 in the second shape (the CUDA kernels' 16-byte paths). Multi-head
  // (NKV = NH), then grouped-query: two query heads per key/value head, and four on one.
  for (const auto& [B, T, C, NH, NKV] :
       {std::array{2, 37, 48, 4, 4}, std::array{2, 64, 64, 4, 4}, std::array{2, 37, 48, 4, 2},
        std::array{2, 64, 64, 4, 1}})
    t.push_back({"attention_T" + std::to_string(T) +
                     (NKV != NH ? "_kv" + std::to_string(NKV) : std::string()),
                 [=](OpRun& r) {
                   const std::size_t n = std::size_t(B) * T * C;
                   const std::size_t n_qkv = std::size_t(B) * T * (C + 2 * (C / NH) * NKV);
                   const Act* qkv = r.act(r.randn(n_qkv, 1));
                   void* state = r.scratch(r.ops.attention_state_bytes(B, T, NH));
                   Act* out = r.act_out("out", n, {1e-5, 2e-2});
                   r.ops.attention_forward(out, state, qkv, B, T, C, NH, NKV);
                   // bf16: probabilities, scores and their gradients are rounded on the way.
                   r.ops.attention_backward(r.act_out("dqkv", n_qkv, {1e-5, 3e-2}),
                                            r.act(r.randn(n, 2)), qkv, out, state, B, T, C, NH,
                                            NKV);
                 }});
  // Ring attention's steps (context parallelism): the queries of a piece at positions
  // 36..47 against the k|v of its own piece (the diagonal, written), of a piece wholly
  // before them and of one that overlaps them (merged); then the backward steps against
  // the same pieces.
  for (const int NKV : {4, 2})
    t.push_back({"ring_attention_steps" + (NKV != 4 ? "_kv" + std::to_string(NKV) : std::string()),
                 [=](OpRun& r) {
                   const int B = 2, len = 12, C = 48, NH = 4, Wkv = 2 * (C / NH) * NKV, W = C + Wkv;
                   const std::size_t n = std::size_t(B) * len * C, n_qkv = std::size_t(B) * len * W;
                   const std::size_t n_kv = std::size_t(B) * len * Wkv;
                   using Piece = Ops::SeqPiece;
                   const std::vector<float> qkv = r.randn(n_qkv, 1);
                   std::vector<float> own_kv(n_kv);
                   for (std::size_t row = 0; row < std::size_t(B) * len; ++row)
                     std::copy_n(qkv.begin() + row * W + C, Wkv, own_kv.begin() + row * Wkv);
                   const Piece q{r.act(qkv), 36, len};
                   const Piece self{r.act(own_kv), 36, len};
                   const Piece before{r.act(r.randn(n_kv, 2)), 0, len};
                   const Piece overlapping{r.act(r.randn(n_kv, 3)), 30, len};
                   Act* out = r.act_out("out", n, {1e-5, 2e-2});
                   float* lse = r.f32_out("lse", std::size_t(B) * NH * len, {1e-5, 1e-2});
                   r.ops.ring_attention_forward_step(out, lse, q, self, B, C, NH, NKV, true);
                   for (const Piece& kv : {before, overlapping})
                     r.ops.ring_attention_forward_step(out, lse, q, kv, B, C, NH, NKV, false);
                   const std::vector<float> zeros(n_qkv, 0.0f), kv_zeros(n_kv, 0.0f);
                   Act* dq = r.act_inout("dq", zeros, {1e-5, 3e-2});
                   Act* d_self = r.act_inout("d_self", kv_zeros, {1e-5, 3e-2});
                   Act* d_before = r.act_inout("d_before", kv_zeros, {1e-5, 3e-2});
                   Act* d_overlapping = r.act_inout("d_overlapping", kv_zeros, {1e-5, 3e-2});
                   const Act* dout = r.act(r.randn(n, 4));
                   r.ops.ring_attention_backward_step(dq, d_self, dout, out, lse, q, self, B, C, NH,
                                                      NKV);
                   r.ops.ring_attention_backward_step(dq, d_before, dout, out, lse, q, before, B, C,
                                                      NH, NKV);
                   r.ops.ring_attention_backward_step(dq, d_overlapping, dout, out, lse, q,
                                                      overlapping, B, C, NH, NKV);
                 }});
  // A block of columns between arrays of other widths (the ring's k|v of q|k|v, and back
  // into a gradient whose other columns stay).
  t.push_back({"copy_columns", [=](OpRun& r) {
                 const int rows = 37, src_width = 40, dst_width = 24;
                 Act* dst = r.act_inout("dst", r.randn(std::size_t(rows) * dst_width, 1), kAct);
                 const Act* src = r.act(r.randn(std::size_t(rows) * src_width, 2));
                 r.ops.copy_columns(dst, dst_width, 5, src, src_width, 16, rows, 19);
               }});
  add_embedding_and_loss_cases(t);
  add_vocab_parallel_cases(t);
  for (bool in_place : {false, true})  // in place: out aliases a
    t.push_back({in_place ? "add_in_place" : "add", [=](OpRun& r) {
                   const std::size_t n = 4099;
                   const std::vector<float> a = r.randn(n, 1);
                   Act* out = in_place ? r.act_inout("out", a, kAct) : r.act_out("out", n, kAct);
                   r.ops.add(out, in_place ? out : r.act(a), r.act(r.randn(n, 2)), n);
                 }});
  return t;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = make_cases();
  return cases;
}

}  // namespace pptrain::ops::testing
