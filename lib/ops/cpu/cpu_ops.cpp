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
// GEMM work items. OpenBLAS's threads split C by the thread count, and its kernels add
// an element's K products in an order that depends on the element's place in the block
// a thread computes (e.g. the last rows of a block take an edge path), so its threaded
// product differs in the last bits between thread counts. Instead the work is cut by
// the shape alone into about kGemmTiles items, each one single-threaded OpenBLAS call:
// - C tiles, as square as the shape allows (a call packs its rows of A and columns of
//   B, so a squarer tile packs less per product), no side under 64 unless the matrix's
//   is, sides multiples of 16;
// - for a long K (at least twice C's longer side: weight gradients over many tokens, the
//   tied head's input gradient, whose K is the vocabulary), also K parts, one per
//   multiple of that side, with fewer tiles: tiles alone would pack the long operands
//   once per tile row or column. Part p > 0 goes to its own buffer (all of them at most
//   kMaxPartialFloats), and the parts are added to C in order.
constexpr int kGemmTiles = 16;
constexpr std::size_t kMaxPartialFloats = std::size_t(1) << 22;  // 16 MiB

struct GemmGrid {
  int tile_rows, tile_cols;
  int k_step, k_parts;  // K in k_parts parts of k_step (the last may be shorter)
};
// M and N positive; whole_k: no K parts.
GemmGrid gemm_grid(int M, int N, int K, bool whole_k = false) {
  const std::size_t partial = std::size_t(M) * std::size_t(N);
  const int most_parts = int(std::min<std::size_t>(kGemmTiles, 1 + kMaxPartialFloats / partial));
  const int parts = whole_k ? 1 : std::clamp(K / std::max(M, N), 1, most_parts);
  const int k_step = parts == 1 ? K : ((K + parts - 1) / parts + 15) / 16 * 16;
  const int k_parts = parts == 1 ? 1 : (K + k_step - 1) / k_step;
  const int tiles = (kGemmTiles + k_parts - 1) / k_parts;
  const int most_r = std::max(1, M / 64), most_c = std::max(1, N / 64);
  // r row and c column parts: r / c about M / N, r * c about tiles.
  int r = std::clamp(int(std::lround(std::sqrt(double(tiles) * M / N))), 1, most_r);
  const int c = std::clamp((tiles + r - 1) / r, 1, most_c);
  r = std::clamp((tiles + c - 1) / c, 1, most_r);
  auto side = [](int n, int pieces) {
    return std::min(n, ((n + pieces - 1) / pieces + 15) / 16 * 16);
  };
  return {side(M, r), side(N, c), k_step, k_parts};
}

// C = alpha op(A) op(B) + beta C over gemm_grid's items, handed out dynamically (an
// item's result does not depend on the thread that computes it: on a shared machine one
// core often runs slower, and fixed halves left the other waiting at the region's end).
// With K parts, `partials` holds (k_parts - 1) M x N floats. Otherwise
// before(i0, j0, m, n) runs on a tile just ahead of its call and after(i0, j0, m, n)
// once its product is in C, on the same thread, while the tile is in its cache.
template <typename Before, typename After>
void grid_gemm(const GemmGrid& g, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               const float* A, const float* B, float beta, float* C, float* partials,
               Before before, After after) {
  // BLAS rejects a leading dimension of 0 even when the matrix is empty (K == 0).
  const int lda = std::max(1, trans_a ? M : K);
  const int ldb = std::max(1, trans_b ? K : N);
  const int tile_cols = (N + g.tile_cols - 1) / g.tile_cols;
  const int tiles = (M + g.tile_rows - 1) / g.tile_rows * tile_cols;
  const std::size_t MN = std::size_t(M) * N;
  // Always a parallel region (even for one item): OpenBLAS's OpenMP build runs a call
  // made inside an active region on the calling thread, and with one thread in the pool
  // it runs single-threaded anyway.
#pragma omp parallel for schedule(dynamic)
  for (int item = 0; item < tiles * g.k_parts; ++item) {
    const int part = item / tiles, t = item % tiles;
    const int i0 = t / tile_cols * g.tile_rows, j0 = t % tile_cols * g.tile_cols;
    const int m = std::min(g.tile_rows, M - i0), n = std::min(g.tile_cols, N - j0);
    const int k0 = part * g.k_step, kc = std::min(g.k_step, K - k0);
    // Rows i0.. and columns k0.. of op(A), rows k0.. and columns j0.. of op(B),
    // whichever way each is stored.
    const float* a = A + (trans_a ? std::size_t(k0) * lda + i0 : std::size_t(i0) * lda + k0);
    const float* b = B + (trans_b ? std::size_t(j0) * ldb + k0 : std::size_t(k0) * ldb + j0);
    float* c = part == 0 ? C : partials + (part - 1) * MN;
    before(i0, j0, m, n);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, kc, alpha, a, lda, b, ldb,
                part == 0 ? beta : 0.0f, c + std::size_t(i0) * N + j0, N);
    after(i0, j0, m, n);
  }
  if (g.k_parts == 1) return;
  constexpr std::ptrdiff_t kBlock = 1 << 14;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t e0 = 0; e0 < std::ptrdiff_t(MN); e0 += kBlock) {
    const std::size_t e1 = std::min(MN, std::size_t(e0 + kBlock));
    for (int p = 1; p < g.k_parts; ++p) {
      const float* part = partials + (p - 1) * MN;
      for (std::size_t e = std::size_t(e0); e < e1; ++e) C[e] += part[e];
    }
  }
}
}  // namespace

void CpuOps::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  const float* B, float beta, float* C) {
  PPTRAIN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size");
  if (M == 0 || N == 0) return;
  const GemmGrid g = gemm_grid(M, N, K);
  float* partials =
      g.k_parts > 1 ? float_scratch(std::size_t(g.k_parts - 1) * std::size_t(M) * N) : nullptr;
  auto nothing = [](int, int, int, int) {};
  grid_gemm(g, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, partials, nothing, nothing);
}

void CpuOps::linear_forward(float* out, float* gelu_out, const float* inp, const float* w,
                            const float* bias, int N, int Cin, int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin >= 0 && Cout >= 0, "linear_forward: negative size");
  if (N == 0 || Cout == 0) return;
  // Per output tile, over the whole K (a layer's K is its input width, long only for a
  // handful of rows): the bias is written first and the product added to it (beta 1, so
  // OpenBLAS makes no pass to clear the tile), then GELU reads the tile from cache.
  auto write_bias = [&](int i0, int j0, int m, int n) {
    if (bias == nullptr) return;
    for (int i = i0; i < i0 + m; ++i)
      std::copy(bias + j0, bias + j0 + n, out + std::size_t(i) * Cout + j0);
  };
  auto gelu = [&](int i0, int j0, int m, int n) {
    if (gelu_out == nullptr) return;
    for (int i = i0; i < i0 + m; ++i) {
      const std::size_t row = std::size_t(i) * Cout + j0;
      cpu::gelu_forward_range(gelu_out, out, row, row + n);
    }
  };
  grid_gemm(gemm_grid(N, Cout, Cin, /*whole_k=*/true), false, false, N, Cout, Cin, 1.0f, inp, w,
            bias ? 1.0f : 0.0f, out, nullptr, write_bias, gelu);
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
