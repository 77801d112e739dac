// CPU backend: causal attention in blocks (flash-style), keeping no T x T probabilities.
// The forward runs over key blocks with a running maximum and sum (online softmax) and
// saves only each row's log-sum-exp; the backward recomputes each block's probabilities
// from it. Blocks of kAttentionRowBlock rows and columns, in a fixed order. The forward
// splits the (batch, query head) pairs over the OpenMP threads; the backward splits the
// (batch, key/value head) pairs, each running its group's query heads in order, so
// nothing depends on the thread count. Selected by train.attention: fused on the CPU.
//
// The same kernels take the queries of one piece of the sequence and the keys of another
// (SeqChunk; the keys' rows may be k|v alone), causal by position in the whole sequence:
// the steps of ring attention, where each context-parallel rank holds pieces of every
// sequence. The whole-sequence forms are the case of one piece against itself.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "ops/cpu/cpu_math.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

namespace {

constexpr int R = kAttentionRowBlock;

// The pointers of one (batch, query head): q rows have stride W, k and v rows the key
// piece's width (W, or 2 Ckv for k|v alone), out rows stride C.
struct Head {
  const float* q;
  const float* k;
  const float* v;
  std::size_t out_offset;  // of row 0 in out/dout
};

// Query head h of batch b from piece q, its key/value head from piece kv.
Head head_of(const SeqChunk& q, const SeqChunk& kv, int b, int h, const AttentionLayout& L) {
  const float* q_rows = q.rows + static_cast<std::size_t>(b) * q.len * L.W;  // batch b's
  const float* kv_rows = kv.rows + static_cast<std::size_t>(b) * kv.len * L.width(kv.kv_only);
  const int kvh = h / L.group;
  return {q_rows + static_cast<std::size_t>(h) * L.hs, kv_rows + L.k_offset(kvh, kv.kv_only),
          kv_rows + L.v_offset(kvh, kv.kv_only),
          static_cast<std::size_t>(b) * q.len * L.C + static_cast<std::size_t>(h) * L.hs};
}

// How many of the keys c0.. (cols of them) query row `row` of q may see: those at or
// before its position in the whole sequence.
int visible(const SeqChunk& q, int row, const SeqChunk& kv, int c0, int cols) {
  return std::clamp(q.first + row - (kv.first + c0) + 1, 0, cols);
}
// The end of the keys of kv that query rows before r1 of q may see.
int keys_end(const SeqChunk& q, int r1, const SeqChunk& kv) {
  return std::clamp(q.first + r1 - kv.first, 0, kv.len);
}

// Per-thread scratch of the blocked kernels: three R x R tiles and R x hs accumulators,
// and the thread's GEMM workspace.
struct Tiles {
  float* s;   // scores, then probabilities
  float* dp;  // dout @ v^T, then the score gradient
  float* acc; // R x hs
  cpu::GemmWorkspace* gemm;

  // C = alpha op(A) op(B) + beta C on this thread (cpu_gemm.hpp's order).
  void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
             const float* B, int ldb, float beta, float* C, int ldc) const {
    cpu::gemm_serial({ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc}, *gemm);
  }
};

// Runs body(i, tiles, extra) for i in [0, n) on the OpenMP threads; each thread's slice
// of `scratch` (per_thread floats) holds its tiles and then `extra`, the rest of the slice.
template <typename Body>
void for_each_tiled(float* scratch, cpu::GemmWorkspace* gemm, std::size_t per_thread,
                    std::size_t tile_floats, int n, Body body) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    const int thread = omp_get_thread_num();
    float* base = scratch + per_thread * static_cast<std::size_t>(thread);
    body(i, Tiles{base, base + R * R, base + 2 * R * R, gemm + thread}, base + tile_floats);
  }
}

// The row kernels of a block, compiled for the widest vectors this CPU runs (the same
// operations in the same order on every width: the same bits).
// Forward, one query row: its scores s[0, cols), the first `valid` visible, become
// exp(s - new maximum) (the rest 0); the running maximum and sum, and the row's
// accumulator acc[0, hs), are brought to the new maximum.
PPTRAIN_WIDE_CLONES
void online_softmax_row(float* s, int valid, int cols, float* acc, int hs, float& max,
                        double& sum) {
  std::fill(s + valid, s + cols, 0.0f);
  if (valid == 0) return;  // p is 0: this row's acc is unchanged
  const float m_new = std::max(max, cpu::row_max(s, valid));
  const float rescale = cpu::exp_nonpositive(max - m_new);
  for (int j = 0; j < valid; ++j) s[j] = cpu::exp_nonpositive(s[j] - m_new);
  sum = sum * rescale + cpu::row_sum(s, valid);
  max = m_new;
  for (int d = 0; d < hs; ++d) acc[d] *= rescale;
}

// Backward, one query row: scores p[0, cols) become probabilities exp(p - lse), and
// g[0, cols) (dout . v) the gradient w.r.t. q . k; entries from `valid` on are 0.
PPTRAIN_WIDE_CLONES
void probability_gradient_row(float* p, float* g, int valid, int cols, float lse, float delta,
                              float scale) {
  for (int j = 0; j < valid; ++j) {
    p[j] = cpu::exp_nonpositive(std::min(p[j] - lse, 0.0f));
    g[j] = scale * p[j] * (g[j] - delta);
  }
  std::fill(p + valid, p + cols, 0.0f);
  std::fill(g + valid, g + cols, 0.0f);
}

}  // namespace

std::size_t CpuOps::blocked_tile_floats(int hs) { return std::size_t(2) * R * R + std::size_t(R) * hs; }

void CpuOps::attention_forward_blocked(float* out, float* lse, const float* qkv, int B, int T,
                                       int C, int NH, int NKV) {
  const SeqChunk whole{qkv, 0, T};
  blocked_forward(out, lse, whole, whole, B, C, NH, NKV, false);
}

void CpuOps::ring_attention_forward_step(float* out, float* lse, const SeqChunk& q,
                                         const SeqChunk& kv, int B, int C, int NH, int NKV,
                                         bool write) {
  blocked_forward(out, lse, q, kv, B, C, NH, NKV, !write);
}

void CpuOps::blocked_forward(float* out, float* lse, const SeqChunk& q, const SeqChunk& kv, int B,
                             int C, int NH, int NKV, bool merge) {
  PPTRAIN_CHECK(!q.kv_only, "blocked attention: the queries' piece holds no q");
  const AttentionLayout L = attention_layout(B, q.len, C, NH, NKV);
  const int hs = L.hs, W = L.W, Wk = L.width(kv.kv_only), T = q.len;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t per_thread = blocked_tile_floats(hs);
  float* scratch = float_scratch(per_thread * static_cast<std::size_t>(omp_get_max_threads()));
  for_each_tiled(scratch, thread_gemm_workspaces(), per_thread, per_thread, B * NH,
                 [&](int bh, const Tiles& t, float* /*extra*/) {
    const Head hd = head_of(q, kv, bh / NH, bh % NH, L);
    float* row_lse = lse + static_cast<std::size_t>(bh) * T;
    for (int r0 = 0; r0 < T; r0 += R) {
      const int r1 = std::min(T, r0 + R), rows = r1 - r0;
      const int c_end = keys_end(q, r1, kv);
      float row_max[R];
      double row_sum[R];
      std::fill(row_max, row_max + rows, -std::numeric_limits<float>::infinity());
      std::fill(row_sum, row_sum + rows, 0.0);
      std::fill(t.acc, t.acc + static_cast<std::size_t>(rows) * hs, 0.0f);
      for (int c0 = 0; c0 < c_end; c0 += R) {
        const int c1 = std::min(c_end, c0 + R), cols = c1 - c0;
        t.sgemm(false, true, rows, cols, hs, scale, hd.q + static_cast<std::size_t>(r0) * W, W,
              hd.k + static_cast<std::size_t>(c0) * Wk, Wk, 0.0f, t.s, R);
        for (int i = 0; i < rows; ++i)
          online_softmax_row(t.s + static_cast<std::size_t>(i) * R,
                             visible(q, r0 + i, kv, c0, cols), cols,
                             t.acc + static_cast<std::size_t>(i) * hs, hs, row_max[i],
                             row_sum[i]);
        // acc += p @ v[c0:c1]
        t.sgemm(false, false, rows, hs, cols, 1.0f, t.s, R,
              hd.v + static_cast<std::size_t>(c0) * Wk, Wk, 1.0f, t.acc, hs);
      }
      for (int i = 0; i < rows; ++i) {
        float* o = out + hd.out_offset + static_cast<std::size_t>(r0 + i) * C;
        const float* a = t.acc + static_cast<std::size_t>(i) * hs;
        if (!merge) {
          const float inv = static_cast<float>(1.0 / row_sum[i]);
          for (int d = 0; d < hs; ++d) o[d] = a[d] * inv;
          row_lse[r0 + i] = static_cast<float>(row_max[i] + std::log(row_sum[i]));
          continue;
        }
        if (row_sum[i] == 0.0) continue;  // no key of this piece is visible to the row
        // out and lse so far (lse -inf: nothing yet) merged with this piece's, each
        // weighted by its share of the row's total exp-sum.
        const double piece = row_max[i] + std::log(row_sum[i]), before = row_lse[r0 + i];
        const double top = std::max(piece, before);
        const double w_before = std::exp(before - top), w_piece = std::exp(piece - top);
        const double total = w_before + w_piece;
        const double keep = w_before / total, add = w_piece / (total * row_sum[i]);
        for (int d = 0; d < hs; ++d) o[d] = static_cast<float>(o[d] * keep + a[d] * add);
        row_lse[r0 + i] = static_cast<float>(top + std::log(total));
      }
    }
  });
}

void CpuOps::attention_backward_blocked(float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int B, int T, int C,
                                        int NH, int NKV) {
  const SeqChunk whole{qkv, 0, T};
  blocked_backward(dqkv, dqkv, dout, out, lse, whole, whole, B, C, NH, NKV, false);
}

void CpuOps::ring_attention_backward_step(float* dq, float* dkv, const float* dout,
                                          const float* out, const float* lse, const SeqChunk& q,
                                          const SeqChunk& kv, int B, int C, int NH, int NKV) {
  blocked_backward(dq, dkv, dout, out, lse, q, kv, B, C, NH, NKV, true);
}

void CpuOps::blocked_backward(float* dq_rows, float* dkv_rows, const float* dout,
                              const float* out, const float* lse, const SeqChunk& q,
                              const SeqChunk& kv, int B, int C, int NH, int NKV,
                              bool accumulate) {
  PPTRAIN_CHECK(!q.kv_only, "blocked attention: the queries' piece holds no q");
  const AttentionLayout L = attention_layout(B, q.len, C, NH, NKV);
  const int hs = L.hs, W = L.W, Wk = L.width(kv.kv_only), T = q.len;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t per_thread = blocked_tile_floats(hs) + static_cast<std::size_t>(T);
  float* scratch = float_scratch(per_thread * static_cast<std::size_t>(omp_get_max_threads()));
  // extra: delta[t] = dout[t] . out[t] of the current query head
  for_each_tiled(scratch, thread_gemm_workspaces(), per_thread, blocked_tile_floats(hs), B * NKV,
                 [&](int bkv, const Tiles& t, float* delta) {
    const int b = bkv / NKV, kvh = bkv % NKV;
    const std::size_t base = static_cast<std::size_t>(b) * kv.len * Wk;  // batch b's first row
    float* dk = dkv_rows + base + L.k_offset(kvh, kv.kv_only);
    float* dv = dkv_rows + base + L.v_offset(kvh, kv.kv_only);
    if (!accumulate)
      for (int r = 0; r < kv.len; ++r) {
        const std::size_t at = static_cast<std::size_t>(r) * Wk;
        std::fill(dk + at, dk + at + hs, 0.0f);
        std::fill(dv + at, dv + at + hs, 0.0f);
      }
    // The group's query heads in order; within one, query blocks in order, and within
    // one of those key blocks in order: every dk/dv row receives its contributions in
    // the same sequence on any thread count.
    for (int h = kvh * L.group; h < (kvh + 1) * L.group; ++h) {
      const Head hd = head_of(q, kv, b, h, L);
      const float* row_lse = lse + (static_cast<std::size_t>(b) * NH + h) * T;
      const float* d_head = dout + hd.out_offset;
      const float* o_head = out + hd.out_offset;
      float* dq = dq_rows + (hd.q - q.rows);
      for (int r = 0; r < T; ++r) {
        const std::size_t at = static_cast<std::size_t>(r) * C;
        delta[r] = static_cast<float>(cpu::row_dot(d_head + at, o_head + at, hs));
        if (!accumulate)
          std::fill(dq + static_cast<std::size_t>(r) * W,
                    dq + static_cast<std::size_t>(r) * W + hs, 0.0f);
      }
      for (int r0 = 0; r0 < T; r0 += R) {
        const int r1 = std::min(T, r0 + R), rows = r1 - r0;
        const int c_end = keys_end(q, r1, kv);
        const float* q_rows = hd.q + static_cast<std::size_t>(r0) * W;
        const float* d_rows = d_head + static_cast<std::size_t>(r0) * C;
        for (int c0 = 0; c0 < c_end; c0 += R) {
          const int c1 = std::min(c_end, c0 + R), cols = c1 - c0;
          const std::size_t key_rows = static_cast<std::size_t>(c0) * Wk;
          // p = exp(scale * q k^T - lse), recomputed; dp = dout @ v^T.
          t.sgemm(false, true, rows, cols, hs, scale, q_rows, W, hd.k + key_rows, Wk, 0.0f, t.s, R);
          t.sgemm(false, true, rows, cols, hs, 1.0f, d_rows, C, hd.v + key_rows, Wk, 0.0f, t.dp, R);
          for (int i = 0; i < rows; ++i)
            probability_gradient_row(t.s + static_cast<std::size_t>(i) * R,
                                     t.dp + static_cast<std::size_t>(i) * R,
                                     visible(q, r0 + i, kv, c0, cols), cols, row_lse[r0 + i],
                                     delta[r0 + i], scale);
          // dq[r0:r1] += g @ k[c0:c1]; dk[c0:c1] += g^T @ q[r0:r1];
          // dv[c0:c1] += p^T @ dout[r0:r1]
          t.sgemm(false, false, rows, hs, cols, 1.0f, t.dp, R, hd.k + key_rows, Wk, 1.0f,
                dq + static_cast<std::size_t>(r0) * W, W);
          t.sgemm(true, false, cols, hs, rows, 1.0f, t.dp, R, q_rows, W, 1.0f, dk + key_rows, Wk);
          t.sgemm(true, false, cols, hs, rows, 1.0f, t.s, R, d_rows, C, 1.0f, dv + key_rows, Wk);
        }
      }
    }
  });
}

}  // namespace pptrain::ops
