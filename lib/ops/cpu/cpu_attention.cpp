// CPU backend: causal self-attention with grouped key/value heads, forward and backward.
// Each (batch, query head) runs as a few single-thread GEMMs (cpu::gemm_serial) that read
// q, k and v in place from qkv rows of W = C + 2*Ckv elements (leading dimension W) and
// write out[B,T,C] (leading dimension C); query head h reads key/value head h / (NH/NKV).
// Rows go in blocks of kAttentionRowBlock; a block only meets key columns up to its
// last row, so most of the masked upper triangle is never computed. The forward splits
// the (batch, query head) pairs over the OpenMP threads, the backward the (batch,
// key/value head) pairs, each looping over its group's query heads in order (the GEMMs
// inside run on one thread); each pair writes only its own outputs, so nothing depends
// on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "ops/cpu/cpu_math.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

namespace {

// C[M,N] = alpha * op(A) @ op(B) + beta * C with explicit leading dimensions, on this
// thread with its workspace (cpu_gemm.hpp's order).
void sgemm(cpu::GemmWorkspace& ws, bool ta, bool tb, int M, int N, int K, float alpha,
           const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cpu::gemm_serial({ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc}, ws);
}

// The row kernels below are compiled for the widest vectors this CPU runs (the same
// operations in the same order on every width: the same bits).
// In place over row t of scores (columns [0, T)): softmax over [0, t], zeros after.
PPTRAIN_WIDE_CLONES
void causal_softmax_row(float* row, int t, int T) {
  const int n = t + 1;
  const float maxv = cpu::row_max(row, n);
  for (int j = 0; j < n; ++j) row[j] = cpu::exp_nonpositive(row[j] - maxv);
  const float inv = static_cast<float>(1.0 / cpu::row_sum(row, n));
  for (int j = 0; j < n; ++j) row[j] *= inv;
  std::fill(row + n, row + T, 0.0f);
}

// Row t of the softmax backward, in place over p[0, T) (the probabilities' gradient):
// scale * att * (p - sum_j p att) over [0, t], zeros after.
PPTRAIN_WIDE_CLONES
void causal_softmax_backward_row(float* p, const float* att, int t, int T, float scale) {
  const float dot = static_cast<float>(cpu::row_dot(p, att, t + 1));
  for (int j = 0; j <= t; ++j) p[j] = scale * att[j] * (p[j] - dot);
  std::fill(p + t + 1, p + T, 0.0f);
}

}  // namespace

AttentionLayout attention_layout(int B, int T, int C, int NH, int NKV) {
  PPTRAIN_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && NKV > 0, "attention: non-positive size");
  PPTRAIN_CHECK(C % NH == 0, "attention: C must be a multiple of NH");
  PPTRAIN_CHECK(NH % NKV == 0, "attention: NH must be a multiple of NKV");
  const int hs = C / NH, Ckv = NKV * hs;
  return {hs, C, Ckv, C + 2 * Ckv, NH / NKV};
}

void CpuOps::attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                               int NH, int NKV) {
  const AttentionLayout L = attention_layout(B, T, C, NH, NKV);
  const int hs = L.hs, W = L.W;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  cpu::GemmWorkspace* gemm = thread_gemm_workspaces();
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    cpu::GemmWorkspace& ws = gemm[omp_get_thread_num()];
    const int b = bh / NH, h = bh % NH;
    const float* rows = qkv + static_cast<std::size_t>(b) * T * W;
    const float* q = rows + static_cast<std::size_t>(h) * hs;
    const float* k = rows + L.k_offset(h / L.group);
    const float* v = rows + L.v_offset(h / L.group);
    float* a = att + static_cast<std::size_t>(bh) * T * T;
    float* o = out + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
    for (int r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
      const int r1 = std::min(T, r0 + kAttentionRowBlock);
      float* a_rows = a + static_cast<std::size_t>(r0) * T;
      // scores[r0:r1, 0:r1] = scale * q[r0:r1] @ k[0:r1]^T
      sgemm(ws, false, true, r1 - r0, r1, hs, scale, q + static_cast<std::size_t>(r0) * W, W, k, W,
            0.0f, a_rows, T);
      for (int t = r0; t < r1; ++t) causal_softmax_row(a + static_cast<std::size_t>(t) * T, t, T);
      // out[r0:r1] = att[r0:r1, 0:r1] @ v[0:r1]
      sgemm(ws, false, false, r1 - r0, hs, r1, 1.0f, a_rows, T, v, W, 0.0f,
            o + static_cast<std::size_t>(r0) * C, C);
    }
  }
}

void CpuOps::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                                int B, int T, int C, int NH, int NKV) {
  const AttentionLayout L = attention_layout(B, T, C, NH, NKV);
  const int hs = L.hs, W = L.W;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // dpre[T,T], one per thread: gradient w.r.t. the scaled scores q k^T (before the softmax).
  const std::size_t TT = static_cast<std::size_t>(T) * T;
  float* dpre_all = float_scratch(TT * static_cast<std::size_t>(omp_get_max_threads()));
  cpu::GemmWorkspace* gemm = thread_gemm_workspaces();
#pragma omp parallel for schedule(static)
  for (int bkv = 0; bkv < B * NKV; ++bkv) {
    cpu::GemmWorkspace& ws = gemm[omp_get_thread_num()];
    const int b = bkv / NKV, kvh = bkv % NKV;
    float* dpre = dpre_all + TT * static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t rows = static_cast<std::size_t>(b) * T * W;
    const float* k = qkv + rows + L.k_offset(kvh);
    const float* v = qkv + rows + L.v_offset(kvh);
    float* dk = dqkv + rows + L.k_offset(kvh);
    float* dv = dqkv + rows + L.v_offset(kvh);
    // The group's query heads in order; the first overwrites dk and dv, the others add.
    for (int h = kvh * L.group; h < (kvh + 1) * L.group; ++h) {
      const float beta = h == kvh * L.group ? 0.0f : 1.0f;
      const std::size_t head = static_cast<std::size_t>(h) * hs;
      const float* q = qkv + rows + head;
      float* dq = dqkv + rows + head;
      const float* a = att + (static_cast<std::size_t>(b) * NH + h) * TT;
      const float* d = dout + static_cast<std::size_t>(b) * T * C + head;
      for (int r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
        const int r1 = std::min(T, r0 + kAttentionRowBlock);
        float* p_rows = dpre + static_cast<std::size_t>(r0) * T;
        // datt[r0:r1, 0:r1] = dout[r0:r1] @ v[0:r1]^T
        sgemm(ws, false, true, r1 - r0, r1, hs, 1.0f, d + static_cast<std::size_t>(r0) * C, C, v, W,
              0.0f, p_rows, T);
        // Softmax backward: dpre = scale * att * (datt - sum_j datt * att).
        for (int t = r0; t < r1; ++t)
          causal_softmax_backward_row(dpre + static_cast<std::size_t>(t) * T,
                                      a + static_cast<std::size_t>(t) * T, t, T, scale);
        // dq[r0:r1] = dpre[r0:r1, 0:r1] @ k[0:r1]
        sgemm(ws, false, false, r1 - r0, hs, r1, 1.0f, p_rows, T, k, W, 0.0f,
              dq + static_cast<std::size_t>(r0) * W, W);
      }
      // Key/value rows c0..c1 receive from query rows t >= c0 only (causality; dpre and
      // att are zero above the diagonal):
      // dk[c0:c1] += dpre[c0:T, c0:c1]^T @ q[c0:T], dv[c0:c1] += att[c0:T, c0:c1]^T @ dout[c0:T].
      for (int c0 = 0; c0 < T; c0 += kAttentionRowBlock) {
        const int c1 = std::min(T, c0 + kAttentionRowBlock);
        const std::size_t diag = static_cast<std::size_t>(c0) * T + c0;
        sgemm(ws, true, false, c1 - c0, hs, T - c0, 1.0f, dpre + diag, T,
              q + static_cast<std::size_t>(c0) * W, W, beta,
              dk + static_cast<std::size_t>(c0) * W, W);
        sgemm(ws, true, false, c1 - c0, hs, T - c0, 1.0f, a + diag, T,
              d + static_cast<std::size_t>(c0) * C, C, beta,
              dv + static_cast<std::size_t>(c0) * W, W);
      }
    }
  }
}

}  // namespace pptrain::ops
