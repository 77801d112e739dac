// CPU backend: construction, GEMM (OpenBLAS), bias, embedding and elementwise ops.
// Loops run on OpenMP threads (the pool OpenBLAS uses too). Each output element is
// computed by one thread in a fixed order, so no result depends on the thread count;
// GEMMs too: fixed tiles, each one single-threaded OpenBLAS call.
#include "ops/cpu/cpu_ops.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace pptrain::ops {

CpuOps::CpuOps(int threads, bool blocked_attention)
    : threads_(threads), blocked_attention_(blocked_attention) {
  if (threads > 0) {
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
}

float* CpuOps::float_scratch(std::size_t n) {
  if (fscratch_.size() < n) fscratch_.resize(n);
  return fscratch_.data();
}

float* CpuOps::thread_rows(int width) {
  return float_scratch(static_cast<std::size_t>(width) *
                       static_cast<std::size_t>(omp_get_max_threads()));
}

double* CpuOps::double_scratch(std::size_t n) {
  if (dscratch_.size() < n) dscratch_.resize(n);
  return dscratch_.data();
}

namespace {
// GEMM output tiles. OpenBLAS's threads split C by the thread count, and its kernels add
// an element's K products in an order that depends on the element's place in the block
// a thread computes (e.g. the last rows of a block take an edge path), so its threaded
// product differs in the last bits between thread counts. Instead C is cut into tiles
// fixed by the shape alone, each one single-threaded OpenBLAS call over the whole K:
// about kGemmTiles of them (enough to balance a few threads), as square as the shape
// allows (a call packs its rows of A and columns of B, so a squarer tile packs less per
// product), no side under 64 unless the matrix's is, sides multiples of 16.
constexpr int kGemmTiles = 16;

struct GemmTile {
  int rows, cols;
};
GemmTile gemm_tile(int M, int N) {
  const int most_r = std::max(1, M / 64), most_c = std::max(1, N / 64);
  // r row and c column parts: r / c about M / N, r * c about kGemmTiles.
  int r = std::clamp(int(std::lround(std::sqrt(double(kGemmTiles) * M / N))), 1, most_r);
  const int c = std::clamp((kGemmTiles + r - 1) / r, 1, most_c);
  r = std::clamp((kGemmTiles + c - 1) / c, 1, most_r);
  auto side = [](int n, int parts) {
    return std::min(n, ((n + parts - 1) / parts + 15) / 16 * 16);
  };
  return {side(M, r), side(N, c)};
}

// C = alpha op(A) op(B) + beta C, one single-threaded OpenBLAS call per gemm_tile tile;
// before(i0, j0, m, n) runs on a tile just ahead of its call and after(i0, j0, m, n)
// once its product is in C, on the same thread, while the tile is in its cache.
template <typename Before, typename After>
void tiled_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                const float* B, float beta, float* C, Before before, After after) {
  PPTRAIN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size");
  if (M == 0 || N == 0) return;
  // BLAS rejects a leading dimension of 0 even when the matrix is empty (K == 0).
  const int lda = std::max(1, trans_a ? M : K);
  const int ldb = std::max(1, trans_b ? K : N);
  const GemmTile tile = gemm_tile(M, N);
  const int tile_cols = (N + tile.cols - 1) / tile.cols;
  const int tiles = (M + tile.rows - 1) / tile.rows * tile_cols;
  // Always a parallel region (even for one tile): OpenBLAS's OpenMP build runs a call
  // made inside an active region on the calling thread, and with one thread in the pool
  // it runs single-threaded anyway. Tiles go to whichever thread is free (a tile's
  // result does not depend on which thread computes it): on a shared machine one core
  // often runs slower, and fixed halves left the other waiting at the region's end.
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < tiles; ++t) {
    const int i0 = t / tile_cols * tile.rows, j0 = t % tile_cols * tile.cols;
    const int m = std::min(tile.rows, M - i0), n = std::min(tile.cols, N - j0);
    // Rows i0.. of op(A) and columns j0.. of op(B), whichever way each is stored.
    const float* a = A + (trans_a ? std::size_t(i0) : std::size_t(i0) * lda);
    const float* b = B + (trans_b ? std::size_t(j0) * ldb : std::size_t(j0));
    before(i0, j0, m, n);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, K, alpha, a, lda, b, ldb, beta,
                C + std::size_t(i0) * N + j0, N);
    after(i0, j0, m, n);
  }
}
}  // namespace

void CpuOps::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  const float* B, float beta, float* C) {
  auto nothing = [](int, int, int, int) {};
  tiled_gemm(trans_a, trans_b, M, N, K, alpha, A, B, beta, C, nothing, nothing);
}

void CpuOps::linear_forward(float* out, float* gelu_out, const float* inp, const float* w,
                            const float* bias, int N, int Cin, int Cout) {
  // Per output tile: the bias is written first and the product added to it (beta 1, so
  // OpenBLAS makes no pass to clear the tile), then GELU reads the tile from cache.
  auto write_bias = [&](int i0, int j0, int m, int n) {
    if (bias == nullptr) return;
    for (int i = i0; i < i0 + m; ++i) std::copy(bias + j0, bias + j0 + n, out + std::size_t(i) * Cout + j0);
  };
  auto gelu = [&](int i0, int j0, int m, int n) {
    if (gelu_out == nullptr) return;
    for (int i = i0; i < i0 + m; ++i) {
      const std::size_t row = std::size_t(i) * Cout + j0;
      cpu::gelu_forward_range(gelu_out, out, row, row + n);
    }
  };
  tiled_gemm(false, false, N, Cout, Cin, 1.0f, inp, w, bias ? 1.0f : 0.0f, out, write_bias, gelu);
}

void CpuOps::linear_weight_grad(float* dw, const float* inp, const float* dout, int N, int Cin,
                                int Cout) {
  gemm(true, false, Cin, Cout, N, 1.0f, inp, dout, 1.0f, dw);
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
