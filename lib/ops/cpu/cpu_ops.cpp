// CPU backend: construction, GEMM (OpenBLAS), bias, embedding and elementwise ops.
#include "ops/cpu/cpu_ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace pptrain::ops {

CpuOps::CpuOps(int threads) : threads_(threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}

float* CpuOps::float_scratch(std::size_t n) {
  if (fscratch_.size() < n) fscratch_.resize(n);
  return fscratch_.data();
}

double* CpuOps::double_scratch(std::size_t n) {
  if (dscratch_.size() < n) dscratch_.resize(n);
  return dscratch_.data();
}

void CpuOps::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  const float* B, float beta, float* C) {
  PPTRAIN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size");
  if (M == 0 || N == 0) return;
  // BLAS rejects a leading dimension of 0 even when the matrix is empty (K == 0).
  const int lda = std::max(1, trans_a ? M : K);
  const int ldb = std::max(1, trans_b ? K : N);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
}

void CpuOps::add_bias(float* out, const float* bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    float* row = out + static_cast<std::size_t>(n) * C;
    for (int c = 0; c < C; ++c) row[c] += bias[c];
  }
}

void CpuOps::bias_backward(float* dbias, const float* dout, int N, int C) {
  // Column sums in double, rows in order: fixed reduction order, little rounding.
  double* acc = double_scratch(static_cast<std::size_t>(C));
  std::fill(acc, acc + C, 0.0);
  for (int n = 0; n < N; ++n) {
    const float* row = dout + static_cast<std::size_t>(n) * C;
    for (int c = 0; c < C; ++c) acc[c] += row[c];
  }
  for (int c = 0; c < C; ++c) dbias[c] += static_cast<float>(acc[c]);
}

void CpuOps::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                               int vocab_begin, int vocab_rows, const float* wpe, int B, int T,
                               int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t bt = static_cast<std::size_t>(b) * T + t;
      PPTRAIN_CHECK(tokens[bt] >= 0, "embedding_forward: negative token id");
      const int row = tokens[bt] - vocab_begin;
      float* o = out + bt * C;
      if (row >= 0 && row < vocab_rows) {
        const float* e = wte + static_cast<std::size_t>(row) * C;
        for (int c = 0; c < C; ++c) o[c] = e[c];
      } else {
        for (int c = 0; c < C; ++c) o[c] = 0.0f;
      }
      if (wpe == nullptr) continue;
      const float* p = wpe + static_cast<std::size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  }
}

void CpuOps::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                int vocab_begin, int vocab_rows, int B, int T, int C) {
  // Sequential in (b, t) order, so repeated tokens always add up the same way.
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t bt = static_cast<std::size_t>(b) * T + t;
      PPTRAIN_CHECK(tokens[bt] >= 0, "embedding_backward: negative token id");
      const float* d = dout + bt * C;
      const int row = tokens[bt] - vocab_begin;
      if (row >= 0 && row < vocab_rows) {
        float* e = dwte + static_cast<std::size_t>(row) * C;
        for (int c = 0; c < C; ++c) e[c] += d[c];
      }
      if (dwpe == nullptr) continue;
      float* p = dwpe + static_cast<std::size_t>(t) * C;
      for (int c = 0; c < C; ++c) p[c] += d[c];
    }
  }
}

void CpuOps::add(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

std::unique_ptr<Ops> make_cpu_ops(int threads) { return std::make_unique<CpuOps>(threads); }

}  // namespace pptrain::ops
