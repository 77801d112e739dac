// Ring attention's steps (context parallelism) against the whole-sequence blocked
// attention. Each of cp ranks holds pieces r and 2cp-1-r of every sequence (the causal
// load balancing of Megatron-Core); every rank runs its pieces' queries against every
// piece's keys and values in ring order (the pieces of rank r, r-1, ...), and the
// backward's key/value gradients land in the piece they belong to, as the ring returns
// them to their owner. No messages here: this checks the arithmetic of the steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops {
namespace {

using testing::check_gradient;
using testing::dot;
using testing::randn;
using testing::some_indices;

struct Shape {
  int B, T, C, NH, NKV;
  int width() const { return C + 2 * (C / NH) * NKV; }
};

// Rows [first, first + len) of every sequence of a [B, T, width] array, and back.
std::vector<float> rows_of(const std::vector<float>& a, int B, int T, int width, int first,
                           int len) {
  std::vector<float> piece(std::size_t(B) * len * width);
  for (int b = 0; b < B; ++b)
    std::copy_n(a.begin() + (std::size_t(b) * T + first) * width, std::size_t(len) * width,
                piece.begin() + std::size_t(b) * len * width);
  return piece;
}
void put_rows(std::vector<float>& a, const std::vector<float>& piece, int B, int T, int width,
              int first, int len) {
  for (int b = 0; b < B; ++b)
    std::copy_n(piece.begin() + std::size_t(b) * len * width, std::size_t(len) * width,
                a.begin() + (std::size_t(b) * T + first) * width);
}
// lse rows [first, first + len) of every (batch, head) of a [B, NH, T] array.
void put_lse(std::vector<float>& a, const std::vector<float>& piece, int BH, int T, int first,
             int len) {
  for (int i = 0; i < BH; ++i)
    std::copy_n(piece.begin() + std::size_t(i) * len, len, a.begin() + std::size_t(i) * T + first);
}

// The whole-sequence results assembled from the ring's pieces.
struct Whole {
  std::vector<float> out, lse, dqkv;
};

// Forward (and, when dout is given, backward) by ring steps over cp ranks. The keys and
// values are the pieces' k|v columns alone, as the ring sends them, or with
// `whole_rows` their q|k|v rows.
Whole ring(CpuOps& ops, const Shape& s, int cp, const std::vector<float>& qkv,
           const std::vector<float>* dout, bool whole_rows = false) {
  const int pieces = 2 * cp, len = s.T / pieces, W = s.width(), Wkv = W - s.C;
  const int Wk = whole_rows ? W : Wkv;
  std::vector<std::vector<float>> p_qkv(pieces), p_kv(pieces), p_out(pieces), p_lse(pieces),
      p_dq(pieces), p_dkv(pieces), p_dout(pieces);
  std::vector<SeqChunk> queries(pieces), keys(pieces);
  for (int p = 0; p < pieces; ++p) {
    p_qkv[p] = rows_of(qkv, s.B, s.T, W, p * len, len);
    p_kv[p].resize(std::size_t(s.B) * len * Wk);
    for (std::size_t row = 0; row < std::size_t(s.B) * len; ++row)
      std::copy_n(p_qkv[p].begin() + row * W + (W - Wk), Wk, p_kv[p].begin() + row * Wk);
    queries[p] = {p_qkv[p].data(), p * len, len};
    keys[p] = whole_rows ? queries[p] : SeqChunk{p_kv[p].data(), p * len, len, true};
    p_out[p].assign(std::size_t(s.B) * len * s.C, 0.0f);
    p_lse[p].assign(std::size_t(s.B) * s.NH * len, -std::numeric_limits<float>::infinity());
    p_dq[p].assign(p_qkv[p].size(), 0.0f);
    p_dkv[p].assign(p_kv[p].size(), 0.0f);
    if (dout) p_dout[p] = rows_of(*dout, s.B, s.T, s.C, p * len, len);
  }
  auto held = [&](int rank) { return std::vector<int>{rank, pieces - 1 - rank}; };
  for (int r = 0; r < cp; ++r)
    for (int step = 0; step < cp; ++step)
      for (int q : held(r))
        for (int kv : held((r - step + cp) % cp))
          ops.ring_attention_forward_step(p_out[q].data(), p_lse[q].data(), queries[q], keys[kv],
                                          s.B, s.C, s.NH, s.NKV);
  if (dout)
    for (int r = 0; r < cp; ++r)
      for (int step = 0; step < cp; ++step)
        for (int q : held(r))
          for (int kv : held((r - step + cp) % cp))
            ops.ring_attention_backward_step(p_dq[q].data(), p_dkv[kv].data(), p_dout[q].data(),
                                             p_out[q].data(), p_lse[q].data(), queries[q],
                                             keys[kv], s.B, s.C, s.NH, s.NKV);
  Whole w{std::vector<float>(std::size_t(s.B) * s.T * s.C),
          std::vector<float>(std::size_t(s.B) * s.NH * s.T), std::vector<float>(qkv.size())};
  for (int p = 0; p < pieces; ++p) {
    // The k|v gradients go into the k|v columns (with whole rows, their q part is zero).
    for (std::size_t row = 0; row < std::size_t(s.B) * len; ++row)
      for (int c = 0; c < Wk; ++c) p_dq[p][row * W + (W - Wk) + c] += p_dkv[p][row * Wk + c];
    put_rows(w.out, p_out[p], s.B, s.T, s.C, p * len, len);
    put_lse(w.lse, p_lse[p], s.B * s.NH, s.T, p * len, len);
    put_rows(w.dqkv, p_dq[p], s.B, s.T, W, p * len, len);
  }
  return w;
}

TEST(RingAttention, EveryPieceAgainstEveryPieceIsTheWholeSequence) {
  CpuOps ops(2);
  for (int cp : {1, 2, 4})
    for (int T : {128, 320})  // pieces of 64, 32, 16 and 160, 80, 40 positions
      for (int NKV : {4, 2, 1}) {
        const Shape s{2, T, 32, 4, NKV};
        SCOPED_TRACE("cp " + std::to_string(cp) + " T " + std::to_string(T) + " NKV " +
                     std::to_string(NKV));
        const std::vector<float> qkv = randn(std::size_t(s.B) * T * s.width(), 7 + T + NKV);
        const std::vector<float> dout = randn(std::size_t(s.B) * T * s.C, 11 + T);
        std::vector<float> out(dout.size()), lse(std::size_t(s.B) * s.NH * T),
            dqkv(qkv.size());
        ops.attention_forward_blocked(out.data(), lse.data(), qkv.data(), s.B, T, s.C, s.NH,
                                      NKV);
        ops.attention_backward_blocked(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                       lse.data(), s.B, T, s.C, s.NH, NKV);
        for (bool whole_rows : {false, true}) {
          SCOPED_TRACE(whole_rows ? "q|k|v rows as keys" : "k|v rows as keys");
          const Whole w = ring(ops, s, cp, qkv, &dout, whole_rows);
          for (std::size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(w.out[i], out[i], 2e-6f * (1.0f + std::fabs(out[i]))) << "out " << i;
          for (std::size_t i = 0; i < lse.size(); ++i)
            ASSERT_NEAR(w.lse[i], lse[i], 2e-6f * (1.0f + std::fabs(lse[i]))) << "lse " << i;
          for (std::size_t i = 0; i < dqkv.size(); ++i)
            ASSERT_NEAR(w.dqkv[i], dqkv[i], 2e-5f * (1.0f + std::fabs(dqkv[i]))) << "dqkv " << i;
        }
      }
}

// A piece whose keys all come after its queries leaves out and lse as they were.
TEST(RingAttention, KeysAfterTheQueriesChangeNothing) {
  CpuOps ops(1);
  const Shape s{1, 8, 8, 2, 1};
  const std::vector<float> a = randn(std::size_t(4) * s.width(), 3), b = randn(a.size(), 4);
  std::vector<float> out = randn(std::size_t(4) * s.C, 5), lse = randn(std::size_t(2) * 4, 6);
  const std::vector<float> out0 = out, lse0 = lse;
  ops.ring_attention_forward_step(out.data(), lse.data(), {a.data(), 0, 4}, {b.data(), 4, 4},
                                  s.B, s.C, s.NH, s.NKV);
  EXPECT_EQ(out, out0);
  EXPECT_EQ(lse, lse0);
}

// Finite differences through the whole ring (cp 2: four pieces of 6 positions).
TEST(RingAttention, GradientByFiniteDifferences) {
  CpuOps ops(1);
  for (int NKV : {2, 1}) {
    const Shape s{1, 24, 16, 2, NKV};
    std::vector<float> qkv = randn(std::size_t(s.T) * s.width(), 20 + NKV, 0.5f);
    const std::vector<float> R = randn(std::size_t(s.T) * s.C, 30);
    auto loss = [&] { return dot(ring(ops, s, 2, qkv, nullptr).out, R); };
    const std::vector<float> dqkv = ring(ops, s, 2, qkv, &R).dqkv;
    const testing::GradReport rep = check_gradient(qkv, dqkv, loss, some_indices(qkv.size(), 150, 9));
    EXPECT_GT(rep.checked, 0);
    EXPECT_EQ(rep.bad, 0) << rep.bad << " of " << rep.checked << " bad, first " << rep.first_bad;
  }
}

}  // namespace
}  // namespace pptrain::ops
