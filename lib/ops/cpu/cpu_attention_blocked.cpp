// CPU backend: causal attention in blocks (flash-style), keeping no T x T probabilities.
// The forward runs over key blocks with a running maximum and sum (online softmax) and
// saves only each row's log-sum-exp; the backward recomputes each block's probabilities
// from it. Blocks of kAttentionRowBlock rows and columns, in a fixed order; the
// (batch, head) pairs are split over the OpenMP threads, so nothing depends on the
// thread count. Selected by train.attention: fused on the CPU.
#include <cblas.h>
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

void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The pointers of one (batch, head): q, k and v rows have stride 3C, out rows stride C.
struct Head {
  const float* q;
  const float* k;
  const float* v;
  std::size_t out_offset;  // of row 0 in out/dout
};

Head head_of(const float* qkv, int b, int h, int T, int C, int hs) {
  const float* q = qkv + static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
  return {q, q + C, q + 2 * C, static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs};
}

// Per-thread scratch of the blocked kernels: three R x R tiles and R x hs accumulators.
struct Tiles {
  float* s;   // scores, then probabilities
  float* dp;  // dout @ v^T, then the score gradient
  float* acc; // R x hs
};

// Runs body(bh, head, tiles, extra) for every (batch, head) pair bh on the OpenMP
// threads; each thread's slice of `scratch` (per_thread floats) holds its tiles and then
// `extra`, the rest of the slice.
template <typename Body>
void for_each_head(float* scratch, std::size_t per_thread, std::size_t tile_floats,
                   const float* qkv, int B, int T, int C, int NH, Body body) {
  const int hs = C / NH;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    float* base = scratch + per_thread * static_cast<std::size_t>(omp_get_thread_num());
    body(bh, head_of(qkv, bh / NH, bh % NH, T, C, hs), Tiles{base, base + R * R, base + 2 * R * R},
         base + tile_floats);
  }
}

}  // namespace

std::size_t CpuOps::blocked_tile_floats(int hs) { return std::size_t(2) * R * R + std::size_t(R) * hs; }

void CpuOps::attention_forward_blocked(float* out, float* lse, const float* qkv, int B, int T,
                                       int C, int NH) {
  PPTRAIN_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0, "attention: bad shape");
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t per_thread = blocked_tile_floats(hs);
  float* scratch = float_scratch(per_thread * static_cast<std::size_t>(omp_get_max_threads()));
  for_each_head(scratch, per_thread, per_thread, qkv, B, T, C, NH,
                [&](int bh, const Head& hd, const Tiles& t, float* /*extra*/) {
    float* row_lse = lse + static_cast<std::size_t>(bh) * T;
    for (int r0 = 0; r0 < T; r0 += R) {
      const int r1 = std::min(T, r0 + R), rows = r1 - r0;
      float row_max[R];
      double row_sum[R];
      std::fill(row_max, row_max + rows, -std::numeric_limits<float>::infinity());
      std::fill(row_sum, row_sum + rows, 0.0);
      std::fill(t.acc, t.acc + static_cast<std::size_t>(rows) * hs, 0.0f);
      for (int c0 = 0; c0 < r1; c0 += R) {
        const int c1 = std::min(r1, c0 + R), cols = c1 - c0;
        sgemm(false, true, rows, cols, hs, scale, hd.q + static_cast<std::size_t>(r0) * C3, C3,
              hd.k + static_cast<std::size_t>(c0) * C3, C3, 0.0f, t.s, R);
        for (int i = 0; i < rows; ++i) {
          float* s = t.s + static_cast<std::size_t>(i) * R;
          const int valid = std::min(cols, r0 + i - c0 + 1);  // causal: keys up to row r0 + i
          const float m_old = row_max[i];
          const float m_new = std::max(m_old, cpu::row_max(s, valid));
          const float rescale = cpu::exp_nonpositive(m_old - m_new);
          for (int j = 0; j < valid; ++j) s[j] = cpu::exp_nonpositive(s[j] - m_new);
          std::fill(s + valid, s + cols, 0.0f);
          row_sum[i] = row_sum[i] * rescale + cpu::row_sum(s, valid);
          row_max[i] = m_new;
          float* a = t.acc + static_cast<std::size_t>(i) * hs;
          for (int d = 0; d < hs; ++d) a[d] *= rescale;
        }
        // acc += p @ v[c0:c1]
        sgemm(false, false, rows, hs, cols, 1.0f, t.s, R, hd.v + static_cast<std::size_t>(c0) * C3,
              C3, 1.0f, t.acc, hs);
      }
      for (int i = 0; i < rows; ++i) {
        const float inv = static_cast<float>(1.0 / row_sum[i]);
        float* o = out + hd.out_offset + static_cast<std::size_t>(r0 + i) * C;
        const float* a = t.acc + static_cast<std::size_t>(i) * hs;
        for (int d = 0; d < hs; ++d) o[d] = a[d] * inv;
        row_lse[r0 + i] = static_cast<float>(row_max[i] + std::log(row_sum[i]));
      }
    }
  });
}

void CpuOps::attention_backward_blocked(float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int B, int T, int C,
                                        int NH) {
  PPTRAIN_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0, "attention: bad shape");
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t per_thread = blocked_tile_floats(hs) + static_cast<std::size_t>(T);
  float* scratch = float_scratch(per_thread * static_cast<std::size_t>(omp_get_max_threads()));
  // extra: delta[t] = dout[t] . out[t]
  for_each_head(scratch, per_thread, blocked_tile_floats(hs), qkv, B, T, C, NH,
                [&](int bh, const Head& hd, const Tiles& t, float* delta) {
    const float* row_lse = lse + static_cast<std::size_t>(bh) * T;
    const float* d_head = dout + hd.out_offset;
    const float* o_head = out + hd.out_offset;
    float* dq = dqkv + (hd.q - qkv);
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    for (int r = 0; r < T; ++r) {
      delta[r] = static_cast<float>(cpu::row_dot(d_head + static_cast<std::size_t>(r) * C,
                                                 o_head + static_cast<std::size_t>(r) * C, hs));
      for (int d = 0; d < hs; ++d) {
        const std::size_t at = static_cast<std::size_t>(r) * C3 + d;
        dq[at] = dk[at] = dv[at] = 0.0f;
      }
    }
    // Query blocks in order; within one, key blocks in order: every dk/dv row receives its
    // contributions in the same sequence on any thread count.
    for (int r0 = 0; r0 < T; r0 += R) {
      const int r1 = std::min(T, r0 + R), rows = r1 - r0;
      for (int c0 = 0; c0 < r1; c0 += R) {
        const int c1 = std::min(r1, c0 + R), cols = c1 - c0;
        // p = exp(scale * q k^T - lse), recomputed; dp = dout @ v^T.
        sgemm(false, true, rows, cols, hs, scale, hd.q + static_cast<std::size_t>(r0) * C3, C3,
              hd.k + static_cast<std::size_t>(c0) * C3, C3, 0.0f, t.s, R);
        sgemm(false, true, rows, cols, hs, 1.0f, d_head + static_cast<std::size_t>(r0) * C, C,
              hd.v + static_cast<std::size_t>(c0) * C3, C3, 0.0f, t.dp, R);
        for (int i = 0; i < rows; ++i) {
          float* p = t.s + static_cast<std::size_t>(i) * R;
          float* g = t.dp + static_cast<std::size_t>(i) * R;
          const int valid = std::min(cols, r0 + i - c0 + 1);
          const float l = row_lse[r0 + i], dlt = delta[r0 + i];
          for (int j = 0; j < valid; ++j) {
            p[j] = cpu::exp_nonpositive(std::min(p[j] - l, 0.0f));
            g[j] = scale * p[j] * (g[j] - dlt);  // gradient w.r.t. q . k
          }
          std::fill(p + valid, p + cols, 0.0f);
          std::fill(g + valid, g + cols, 0.0f);
        }
        // dq[r0:r1] += g @ k[c0:c1]; dk[c0:c1] += g^T @ q[r0:r1]; dv[c0:c1] += p^T @ dout[r0:r1]
        sgemm(false, false, rows, hs, cols, 1.0f, t.dp, R, hd.k + static_cast<std::size_t>(c0) * C3,
              C3, 1.0f, dq + static_cast<std::size_t>(r0) * C3, C3);
        sgemm(true, false, cols, hs, rows, 1.0f, t.dp, R, hd.q + static_cast<std::size_t>(r0) * C3,
              C3, 1.0f, dk + static_cast<std::size_t>(c0) * C3, C3);
        sgemm(true, false, cols, hs, rows, 1.0f, t.s, R, d_head + static_cast<std::size_t>(r0) * C, C,
              1.0f, dv + static_cast<std::size_t>(c0) * C3, C3);
      }
    }
  });
}

}  // namespace pptrain::ops
