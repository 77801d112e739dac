// CPU backend: construction, GEMM (cpu_gemm.hpp), bias, embedding and elementwise ops.
// Loops run on OpenMP threads. Each output element is
// computed by one thread in a fixed order, so no result depends on the thread count;
// GEMMs too (cpu_gemm.hpp).
#include "ops/cpu/cpu_ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace pptrain::ops {

CpuOps::CpuOps(int threads, bool blocked_attention)
    : threads_(threads), blocked_attention_(blocked_attention) {
  if (threads > 0) omp_set_num_threads(threads);
}

float* CpuOps::float_scratch(std::size_t n) {
  if (fscratch_.size() < n) fscratch_.resize(n);
  return fscratch_.data();
}

cpu::GemmWorkspace* CpuOps::thread_gemm_workspaces() {
  const auto threads = static_cast<std::size_t>(omp_get_max_threads());
  if (thread_gemm_workspaces_.size() < threads) thread_gemm_workspaces_.resize(threads);
  return thread_gemm_workspaces_.data();
}

float* CpuOps::thread_rows(int width) {
  return float_scratch(static_cast<std::size_t>(width) *
                       static_cast<std::size_t>(omp_get_max_threads()));
}

double* CpuOps::double_scratch(std::size_t n) {
  if (dscratch_.size() < n) dscratch_.resize(n);
  return dscratch_.data();
}

void CpuOps::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  const float* B, float beta, float* C) {
  cpu::GemmArgs g{trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N,
                  beta, C, N};
  cpu::gemm(g, gemm_workspace_, gemm_kernel_);
}

void CpuOps::linear_forward(float* out, float* gelu_out, const float* inp, const float* w,
                            const float* bias, int N, int Cin, int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin >= 0 && Cout >= 0, "linear_forward: negative size");
  // Per output tile: the bias is written first and the product added to it (beta 1),
  // then GELU reads the tile from cache once its last K block is in.
  cpu::GemmTileHook write_bias, gelu;
  if (bias != nullptr)
    write_bias = [&](int i0, int j0, int m, int n) {
      for (int i = i0; i < i0 + m; ++i)
        std::copy(bias + j0, bias + j0 + n, out + std::size_t(i) * Cout + j0);
    };
  if (gelu_out != nullptr)
    gelu = [&](int i0, int j0, int m, int n) {
      for (int i = i0; i < i0 + m; ++i) {
        const std::size_t row = std::size_t(i) * Cout + j0;
        cpu::gelu_forward_range(gelu_out, out, row, row + n);
      }
    };
  cpu::GemmArgs g{false, false, N, Cout, Cin, 1.0f, inp, Cin, w, Cout, bias ? 1.0f : 0.0f,
                  out, Cout};
  cpu::gemm(g, gemm_workspace_, gemm_kernel_, write_bias, gelu);
}

void CpuOps::gemm_residual(bool trans_b, int M, int N, int K, const float* A, const float* B,
                           const float* bias, const float* R, float* D) {
  PPTRAIN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_residual: negative size");
  const cpu::GemmTileHook add_after = [&](int i0, int j0, int m, int n) {
    for (int i = i0; i < i0 + m; ++i) {
      float* d = D + std::size_t(i) * N;
      const float* r = R + std::size_t(i) * N;
      for (int j = j0; j < j0 + n; ++j) d[j] = (bias ? d[j] + bias[j] : d[j]) + r[j];
    }
  };
  cpu::GemmArgs g{false, trans_b, M, N, K, 1.0f, A, K, B, trans_b ? K : N, 0.0f, D, N};
  cpu::gemm(g, gemm_workspace_, gemm_kernel_, {}, add_after);
}

void CpuOps::linear_backward_input(float* dinp, const float* dout, const float* w,
                                   const float* gelu_inp, int N, int Cin, int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin >= 0 && Cout >= 0, "linear_backward_input: negative size");
  // The GELU backward on each tile once its last K block is in, while it is in cache.
  cpu::GemmTileHook gelu;
  if (gelu_inp != nullptr)
    gelu = [&](int i0, int j0, int m, int n) {
      for (int i = i0; i < i0 + m; ++i) {
        const std::size_t row = std::size_t(i) * Cin + j0;
        cpu::gelu_backward_range(dinp, gelu_inp, dinp, row, row + n);
      }
    };
  cpu::GemmArgs g{false, true, N, Cin, Cout, 1.0f, dout, Cout, w, Cout, 0.0f, dinp, Cin};
  cpu::gemm(g, gemm_workspace_, gemm_kernel_, {}, gelu);
}

void CpuOps::linear_weight_grad(float* dw, const float* inp, const float* dout, int N, int Cin,
                                int Cout) {
  gemm(true, false, Cin, Cout, N, 1.0f, inp, dout, 1.0f, dw);
}

namespace {
// sums[c] = the sum over k < kc of strip[k * nr + c], for c < n, in double, k in order
// (a packed strip of op(B): nr a multiple of 16, columns past n are 0).
PPTRAIN_WIDE_CLONES
void strip_column_sums(double* sums, const float* strip, int kc, int nr, int n) {
  for (int c0 = 0; c0 < n; c0 += 16) {
    double acc[16] = {};
    for (int k = 0; k < kc; ++k) {
      const float* row = strip + std::size_t(k) * nr + c0;
      for (int c = 0; c < 16; ++c) acc[c] += row[c];
    }
    std::copy(acc, acc + std::min(16, n - c0), sums + c0);
  }
}
}  // namespace

void CpuOps::linear_grads(float* dw, float* dbias, const float* inp, const float* dout, int N,
                          int Cin, int Cout) {
  if (dbias == nullptr || N == 0 || Cin == 0 || Cout == 0) {
    linear_weight_grad(dw, inp, dout, N, Cin, Cout);
    if (dbias != nullptr) bias_backward(dbias, dout, N, Cout);
    return;
  }
  // The bias gradient from dout's strips as the product packs them (dout is its op(B),
  // one depth a row): each K block's column sums in double, then the blocks' in order.
  const int blocks = (N + cpu::kGemmKBlock - 1) / cpu::kGemmKBlock;
  double* partial = double_scratch(std::size_t(blocks) * Cout);
  const cpu::GemmPackedHook column_sums = [&](int kb, int j0, int n, int kc, int nr,
                                              const float* strips) {
    double* sums = partial + std::size_t(kb) * Cout + j0;
    for (int s = 0; s < n; s += nr)
      strip_column_sums(sums + s, strips + std::size_t(s) * kc, kc, nr, std::min(nr, n - s));
  };
  const cpu::GemmArgs g{true, false, Cin, Cout, N, 1.0f, inp, Cin, dout, Cout, 1.0f, dw, Cout};
  cpu::gemm(g, gemm_workspace_, gemm_kernel_, {}, {}, column_sums);
  for (int c = 0; c < Cout; ++c) {
    double total = 0.0;
    for (int kb = 0; kb < blocks; ++kb) total += partial[std::size_t(kb) * Cout + c];
    dbias[c] += static_cast<float>(total);
  }
}

namespace {
PPTRAIN_WIDE_CLONES
void add_bias_rows(float* out, const float* bias, int n0, int n1, int C) {
  for (int n = n0; n < n1; ++n) {
    float* row = out + static_cast<std::size_t>(n) * C;
    for (int c = 0; c < C; ++c) row[c] += bias[c];
  }
}

// Columns [c0, c1) of dout summed over every row in order, into acc.
PPTRAIN_WIDE_CLONES
void column_sums(double* acc, const float* dout, int N, int C, int c0, int c1) {
  for (int c = c0; c < c1; ++c) acc[c] = 0.0;
  for (int n = 0; n < N; ++n) {
    const float* row = dout + static_cast<std::size_t>(n) * C;
    for (int c = c0; c < c1; ++c) acc[c] += row[c];
  }
}

PPTRAIN_WIDE_CLONES
void add_range(float* out, const float* a, const float* b, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
}
}  // namespace

void CpuOps::add_bias(float* out, const float* bias, int N, int C) {
  constexpr int kRows = 16;
#pragma omp parallel for schedule(static)
  for (int n0 = 0; n0 < N; n0 += kRows) add_bias_rows(out, bias, n0, std::min(N, n0 + kRows), C);
}

void CpuOps::bias_backward(float* dbias, const float* dout, int N, int C) {
  // Column sums in double, rows in order: each column is one thread's, so the
  // reduction order is fixed whatever the thread count.
  double* acc = double_scratch(static_cast<std::size_t>(C));
  cpu::in_column_ranges(C, [&](int c0, int c1) {
    column_sums(acc, dout, N, C, c0, c1);
    for (int c = c0; c < c1; ++c) dbias[c] += static_cast<float>(acc[c]);
  });
}

void CpuOps::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                               int vocab_begin, int vocab_rows, const float* wpe, int B, int T,
                               int C) {
  for (int bt = 0; bt < B * T; ++bt)
    PPTRAIN_CHECK(tokens[bt] >= 0, "embedding_forward: negative token id");
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; ++bt) {
    const int row = tokens[bt] - vocab_begin;
    float* o = out + static_cast<std::size_t>(bt) * C;
    if (row >= 0 && row < vocab_rows) {
      const float* e = wte + static_cast<std::size_t>(row) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = 0.0f;
    }
    if (wpe == nullptr) continue;
    const float* p = wpe + static_cast<std::size_t>(bt % T) * C;
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

void CpuOps::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                int vocab_begin, int vocab_rows, int B, int T, int C) {
  for (int bt = 0; bt < B * T; ++bt)
    PPTRAIN_CHECK(tokens[bt] >= 0, "embedding_backward: negative token id");
  // Each thread owns a range of columns and adds every (b, t) into it in order, so
  // repeated tokens always add up the same way.
  cpu::in_column_ranges(C, [&](int c0, int c1) {
    for (int bt = 0; bt < B * T; ++bt) {
      const float* d = dout + static_cast<std::size_t>(bt) * C;
      const int row = tokens[bt] - vocab_begin;
      if (row >= 0 && row < vocab_rows) {
        float* e = dwte + static_cast<std::size_t>(row) * C;
        for (int c = c0; c < c1; ++c) e[c] += d[c];
      }
      if (dwpe == nullptr) continue;
      float* p = dwpe + static_cast<std::size_t>(bt % T) * C;
      for (int c = c0; c < c1; ++c) p[c] += d[c];
    }
  });
}

void CpuOps::add(float* out, const float* a, const float* b, std::size_t n) {
  constexpr std::size_t kBlock = std::size_t(1) << 14;
  const std::ptrdiff_t blocks = static_cast<std::ptrdiff_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (std::ptrdiff_t k = 0; k < blocks; ++k) {
    const std::size_t i0 = std::size_t(k) * kBlock;
    add_range(out, a, b, i0, std::min(n, i0 + kBlock));
  }
}

std::unique_ptr<Ops> make_cpu_ops(int threads, bool blocked_attention) {
  return std::make_unique<CpuOps>(threads, blocked_attention);
}

}  // namespace pptrain::ops
