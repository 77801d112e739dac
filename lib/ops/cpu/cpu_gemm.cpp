// The CPU backend's blocked fp32 GEMM (see cpu_gemm.hpp for the summation order).
#include "ops/cpu/cpu_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "ops/cpu/blas_kernels.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pptrain::ops::cpu {
namespace {

constexpr int kKc = kGemmKBlock;
// The most rows one work item packs: MC x KC floats stay in the core's L2.
constexpr int kMcMax = 144;
constexpr int kMcMin = 48;
// Columns of packed op(B) that one strip of op(A) meets in turn: KC x 256 floats
// (256 KiB) stay in L2. Also the widest item when op(A) is the smaller operand.
constexpr int kChunk = 256;

// acc holds an MR x NR tile (row i at acc + i * NR); writes its m x n corner to C.
// beta 0: C = alpha acc; otherwise fma(beta, C, alpha acc).
void store_tile(const float* acc, int nr, float* c, int ldc, int m, int n, float alpha,
                float beta) {
  for (int i = 0; i < m; ++i) {
    float* row = c + std::size_t(i) * ldc;
    for (int j = 0; j < n; ++j) {
      const float t = alpha * acc[i * nr + j];
      row[j] = beta == 0.0f ? t : std::fma(beta, row[j], t);
    }
  }
}

// A micro-kernel: the product of an MR-row strip of op(A) (kc x MR, k-major) and an
// NR-column strip of op(B) (kc x NR, k-major), put into the m x n corner of C.
using MicroKernel = void (*)(int kc, const float* a, const float* b, float* c, int ldc, int m,
                             int n, float alpha, float beta);
struct KernelShape {
  int mr, nr;
  MicroKernel run;
};

template <int MR, int NR>
void portable_kernel(int kc, const float* a, const float* b, float* c, int ldc, int m, int n,
                     float alpha, float beta) {
  float acc[MR * NR] = {};
  for (int k = 0; k < kc; ++k)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j)
        acc[i * NR + j] = std::fma(a[k * MR + i], b[k * NR + j], acc[i * NR + j]);
  store_tile(acc, NR, c, ldc, m, n, alpha, beta);
}

#if defined(__x86_64__)
// Asks for the m x n tile of C at the start of a micro-kernel, so that it arrives while
// the products run (the kernel reads or writes it at the end): the first and last float
// of each row (an AVX2 row of 16 floats spans at most two cache lines).
inline void prefetch_tile(const float* c, int ldc, int m, int n) {
  for (int i = 0; i < m; ++i) {
    const float* row = c + std::size_t(i) * ldc;
    _mm_prefetch(reinterpret_cast<const char*>(row), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(row + n - 1), _MM_HINT_T0);
  }
}

// 12 x 32: 24 accumulators, two loads of op(B) and 12 broadcasts of op(A) per k.
__attribute__((target("avx512f"))) void avx512_kernel(int kc, const float* a, const float* b,
                                                      float* c, int ldc, int m, int n,
                                                      float alpha, float beta) {
  constexpr int MR = 12, NR = 32;
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b + k * NR), b1 = _mm512_load_ps(b + k * NR + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[k * MR + i]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (m == MR && n == NR) {
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      float* row = c + std::size_t(i) * ldc;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512 t = _mm512_mul_ps(va, acc[i][h]);
        _mm512_storeu_ps(row + 16 * h, beta == 0.0f
                                           ? t
                                           : _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16 * h), t));
      }
    }
    return;
  }
  alignas(64) float tile[MR * NR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm512_store_ps(tile + i * NR, acc[i][0]);
    _mm512_store_ps(tile + i * NR + 16, acc[i][1]);
  }
  store_tile(tile, NR, c, ldc, m, n, alpha, beta);
}

// 6 x 16: 12 accumulators, two loads of op(B) and 6 broadcasts of op(A) per k.
__attribute__((target("avx2,fma"))) void avx2_kernel(int kc, const float* a, const float* b,
                                                     float* c, int ldc, int m, int n, float alpha,
                                                     float beta) {
  constexpr int MR = 6, NR = 16;
  prefetch_tile(c, ldc, m, n);
  __m256 acc[MR][2];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * NR), b1 = _mm256_load_ps(b + k * NR + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + k * MR + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  if (m == MR && n == NR) {
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      float* row = c + std::size_t(i) * ldc;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 t = _mm256_mul_ps(va, acc[i][h]);
        _mm256_storeu_ps(row + 8 * h,
                         beta == 0.0f ? t : _mm256_fmadd_ps(vb, _mm256_loadu_ps(row + 8 * h), t));
      }
    }
    return;
  }
  alignas(32) float tile[MR * NR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(tile + i * NR, acc[i][0]);
    _mm256_store_ps(tile + i * NR + 8, acc[i][1]);
  }
  store_tile(tile, NR, c, ldc, m, n, alpha, beta);
}
#endif

KernelShape kernel_shape(GemmKernel kernel) {
#if defined(__x86_64__)
  if (kernel == GemmKernel::avx512) return {12, 32, avx512_kernel};
  if (kernel == GemmKernel::avx2) return {6, 16, avx2_kernel};
#endif
  return {4, 16, portable_kernel<4, 16>};
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }
int round_up(int a, int b) { return ceil_div(a, b) * b; }

// Packing writes a strip: `width` lines of kc floats, k-major (dst[k * width + r] is line
// r at depth k), lines past `lines` zero. A line is a row of op(A) or a column of op(B).
// Packing moves floats and computes nothing, so how it runs changes no result; the
// vector forms run where the kernel's instruction set does.
// pack_contiguous: line r at depth k is src[k * ld + r] (each depth's lines adjacent).
void pack_contiguous(const float* src, std::size_t ld, int lines, int kc, int width, float* dst) {
  for (int k = 0; k < kc; ++k) {
    const float* s = src + k * ld;
    float* d = dst + std::size_t(k) * width;
    for (int r = 0; r < lines; ++r) d[r] = s[r];
    for (int r = lines; r < width; ++r) d[r] = 0.0f;
  }
}

#if defined(__x86_64__)
// Depths are often a page apart (ld of 1024 floats), where the hardware prefetcher stops:
// contiguous packing fetches the depth this far on, every cache line of its lines.
constexpr int kPrefetchAhead = 8;
void prefetch_lines(const float* s, int lines) {
  for (int r = 0; r < lines; r += 16)
    _mm_prefetch(reinterpret_cast<const char*>(s + r), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(s + lines - 1), _MM_HINT_T0);  // s may be unaligned
}

// The same with masked AVX-512 moves, 16 lines at a time.
__attribute__((target("avx512f"))) void pack_contiguous_avx512(const float* src, std::size_t ld,
                                                              int lines, int kc, int width,
                                                              float* dst) {
  auto mask = [](int n) { return __mmask16(n >= 16 ? 0xffff : (1u << std::max(n, 0)) - 1); };
  for (int k = 0; k < kc; ++k) {
    const float* s = src + k * ld;
    float* d = dst + std::size_t(k) * width;
    if (k + kPrefetchAhead < kc) prefetch_lines(s + kPrefetchAhead * ld, lines);
    for (int r = 0; r < width; r += 16)
      _mm512_mask_storeu_ps(d + r, mask(width - r), _mm512_maskz_loadu_ps(mask(lines - r), s + r));
  }
}

// Copies the n (6 or 16: the AVX2 kernel's strips) floats of s to d.
__attribute__((target("avx"))) inline void copy_strip_line(const float* s, float* d, int n) {
  if (n == 16) {
    _mm256_storeu_ps(d, _mm256_loadu_ps(s));
    _mm256_storeu_ps(d + 8, _mm256_loadu_ps(s + 8));
  } else {
    _mm_storeu_ps(d, _mm_loadu_ps(s));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(d + 4),
                     _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 4)));
  }
}

// The first n (5 to 8) floats of v to d.
__attribute__((target("avx"))) void store_first(float* d, __m256 v, int n) {
  if (n == 8) return _mm256_storeu_ps(d, v);
  _mm_storeu_ps(d, _mm256_castps256_ps128(v));
  const __m128 high = _mm256_extractf128_ps(v, 1);
  if (n == 5) return _mm_store_ss(d + 4, high);
  _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), high);
  if (n == 7) _mm_store_ss(d + 6, _mm_movehl_ps(high, high));
}

// All the strips of `count` lines at once, each depth's lines adjacent in memory (the
// AVX2 kernel's widths): depth by depth, so that each depth's lines are read in one pass
// from left to right rather than a strip's width at a time.
__attribute__((target("avx"))) void pack_depths_avx(const float* src, std::size_t ld, int count,
                                                    int kc, int width, float* dst) {
  const std::size_t strip = std::size_t(width) * kc;
  for (int k = 0; k < kc; ++k) {
    const float* s = src + k * ld;
    if (k + kPrefetchAhead < kc) prefetch_lines(s + kPrefetchAhead * ld, count);
    float* d = dst + std::size_t(k) * width;
    int r = 0;
    for (; r + width <= count; r += width, d += strip) copy_strip_line(s + r, d, width);
    if (r == count) continue;
    for (int i = 0; i < width; ++i) d[i] = r + i < count ? s[r + i] : 0.0f;
  }
}

// Lines of a transposed strip in blocks of up to 8 lines (at least 5) by 8 depths, each
// an 8 x 8 transpose in AVX registers (a block's missing lines read its first line and
// are not stored); returns the first line not packed.
__attribute__((target("avx"))) int pack_transposed_by_8(const float* src, std::size_t ld,
                                                        int lines, int kc, int width,
                                                        float* dst) {
  int r0 = 0;
  const int k8 = kc / 8 * 8;
  for (int n; (n = std::min(8, lines - r0)) >= 5; r0 += n) {
    const float* s = src + r0 * ld;
    for (int k = 0; k < k8; k += 8) {
      __m256 row[8];
      for (int i = 0; i < 8; ++i) row[i] = _mm256_loadu_ps(s + (i < n ? i : 0) * ld + k);
      // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves: column
      // c of the block ends in row[c].
      __m256 t[8], u[8];
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(row[2 * i], row[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(row[2 * i], row[2 * i + 1]);
      }
      for (int h = 0; h < 2; ++h) {
        const int o = 4 * h;
        u[o] = _mm256_shuffle_ps(t[o], t[o + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[o + 1] = _mm256_shuffle_ps(t[o], t[o + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[o + 2] = _mm256_shuffle_ps(t[o + 1], t[o + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[o + 3] = _mm256_shuffle_ps(t[o + 1], t[o + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int c = 0; c < 4; ++c) {
        row[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20);
        row[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
      }
      float* d = dst + std::size_t(k) * width + r0;
      for (int c = 0; c < 8; ++c) store_first(d + std::size_t(c) * width, row[c], n);
    }
    for (int k = k8; k < kc; ++k)
      for (int i = 0; i < n; ++i) dst[std::size_t(k) * width + r0 + i] = s[i * ld + k];
  }
  return r0;
}
#endif

// pack_transposed: line r at depth k is src[r * ld + k] (each line contiguous): 8 x 8
// blocks (AVX), then 4 x 4 blocks (SSE) transposed in registers, the rest one by one.
void pack_transposed(const float* src, std::size_t ld, int lines, int kc, int width, float* dst,
                     bool avx) {
  int r0 = 0;
#if defined(__x86_64__)
  if (avx) r0 = pack_transposed_by_8(src, ld, lines, kc, width, dst);
  const int k4 = kc / 4 * 4;
  for (; r0 + 4 <= lines; r0 += 4) {
    const float* s = src + r0 * ld;
    for (int k = 0; k < k4; k += 4) {
      __m128 l0 = _mm_loadu_ps(s + k), l1 = _mm_loadu_ps(s + ld + k);
      __m128 l2 = _mm_loadu_ps(s + 2 * ld + k), l3 = _mm_loadu_ps(s + 3 * ld + k);
      _MM_TRANSPOSE4_PS(l0, l1, l2, l3);
      float* d = dst + std::size_t(k) * width + r0;
      _mm_storeu_ps(d, l0);
      _mm_storeu_ps(d + width, l1);
      _mm_storeu_ps(d + 2 * width, l2);
      _mm_storeu_ps(d + 3 * width, l3);
    }
    for (int k = k4; k < kc; ++k)
      for (int r = 0; r < 4; ++r) dst[std::size_t(k) * width + r0 + r] = s[r * ld + k];
  }
#else
  (void)avx;
#endif
  for (int r = r0; r < width; ++r) {
    const float* s = src + r * ld;
    for (int k = 0; k < kc; ++k) dst[std::size_t(k) * width + r] = r < lines ? s[k] : 0.0f;
  }
}

// A strip of `lines` lines, each contiguous (transposed) or each depth's lines adjacent.
void pack_strip(GemmKernel kernel, bool transposed, const float* src, std::size_t ld, int lines,
                int kc, int width, float* dst) {
  if (transposed) return pack_transposed(src, ld, lines, kc, width, dst,
                                         kernel != GemmKernel::portable);
#if defined(__x86_64__)
  if (kernel == GemmKernel::avx512) return pack_contiguous_avx512(src, ld, lines, kc, width, dst);
#endif
  pack_contiguous(src, ld, lines, kc, width, dst);
}

// Lines first..first+count (of `total`) of an operand, depth k0..k0+kc, as strips of
// `width` lines one after another. A line is a row of op(A) or a column of op(B); each
// line is contiguous in memory (line r at depth k is p[r * ld + k]) or each depth's
// lines are (p[k * ld + r]).
void pack_lines(GemmKernel kernel, const float* p, int ld, bool lines_contiguous, int total,
                int first, int count, int k0, int kc, int width, float* dst) {
  count = std::min(count, total - first);
#if defined(__x86_64__)
  if (!lines_contiguous && kernel == GemmKernel::avx2)
    return pack_depths_avx(p + std::size_t(k0) * ld + first, ld, count, kc, width, dst);
#endif
  for (int s = 0; s < count; s += width, dst += std::size_t(width) * kc) {
    const int r = first + s, lines = std::min(width, count - s);
    const float* src = lines_contiguous ? p + std::size_t(r) * ld + k0
                                        : p + std::size_t(k0) * ld + r;
    pack_strip(kernel, lines_contiguous, src, ld, lines, kc, width, dst);
  }
}

// op(A)'s rows i0..i0+m in strips of mr rows; op(B)'s columns j0..j0+n in strips of nr.
void pack_a(const GemmArgs& g, GemmKernel kernel, int i0, int m, int k0, int kc, int mr,
            float* dst) {
  pack_lines(kernel, g.A, g.lda, !g.trans_a, g.M, i0, m, k0, kc, mr, dst);
}
void pack_b(const GemmArgs& g, GemmKernel kernel, int j0, int n, int k0, int kc, int nr,
            float* dst) {
  pack_lines(kernel, g.B, g.ldb, g.trans_b, g.N, j0, n, k0, kc, nr, dst);
}

float* grown(AlignedBuffer<float>& buffer, std::size_t floats) {
  if (buffer.size() < floats) buffer = AlignedBuffer<float>(floats);
  return buffer.data();
}

}  // namespace

bool cpu_runs(GemmKernel kernel) {
  static const CpuIsa isa = this_cpu_isa();  // asked on every call: read the CPU once
  switch (kernel) {
    case GemmKernel::avx512:
      return isa.avx512;
    case GemmKernel::avx2:
      return isa.avx2_fma;
    case GemmKernel::portable:
      return true;
  }
  return false;
}

GemmKernel best_gemm_kernel() {
  static const GemmKernel best = cpu_runs(GemmKernel::avx512) ? GemmKernel::avx512
                                 : cpu_runs(GemmKernel::avx2) ? GemmKernel::avx2
                                                              : GemmKernel::portable;
  return best;
}

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::avx512:
      return "avx512";
    case GemmKernel::avx2:
      return "avx2";
    case GemmKernel::portable:
      return "portable";
  }
  return "?";
}

float* GemmWorkspace::packed_whole(std::size_t floats) { return grown(whole_, floats); }
float* GemmWorkspace::packed_parts(std::size_t floats) { return grown(parts_, floats); }
std::atomic<int>* GemmWorkspace::counters(int n) {
  if (counters_size_ < n) {
    counters_ = std::make_unique<std::atomic<int>[]>(std::size_t(n));
    counters_size_ = n;
  }
  for (int i = 0; i < n; ++i) counters_[i].store(0, std::memory_order_relaxed);
  return counters_.get();
}

namespace {

// Runs the kernel over a tile of C (m x n from i0, j0) for one K block of depth kc, from
// packed strips: op(A)'s rows from i0 at `a` (strips of MR one after another), op(B)'s
// columns from j0 at `b` (strips of NR). Columns go in chunks whose packed op(B) stays in
// L2, each strip of op(A) (in L1) meeting every strip of the chunk. `before` and `after`
// (where not null) run on each chunk just before and after, while it is in cache.
void run_tile(const GemmArgs& g, const KernelShape& ks, int kc, const float* a, const float* b,
              int i0, int j0, int m, int n, float beta, const GemmTileHook* before,
              const GemmTileHook* after) {
  for (int jq = 0; jq < n; jq += kChunk) {
    const int chunk = std::min(kChunk, n - jq);
    if (before) (*before)(i0, j0 + jq, m, chunk);
    for (int ir = 0; ir < m; ir += ks.mr)
      for (int jr = jq; jr < jq + chunk; jr += ks.nr)
        ks.run(kc, a + std::size_t(ir) * kc, b + std::size_t(jr) * kc,
               g.C + std::size_t(i0 + ir) * g.ldc + j0 + jr, g.ldc, std::min(ks.mr, m - ir),
               std::min(ks.nr, n - jr), g.alpha, beta);
    if (after) (*after)(i0, j0 + jq, m, chunk);
  }
}

// Items: at least this many a thread, so that a slower core (on a shared machine one
// often is) finishes late by one small item at most.
constexpr int kItemsPerThread = 4;
// The smaller operand is packed for a group of K blocks at once, at most this many
// floats (1 MiB, in a core's L2).
constexpr std::size_t kWholeFloats = std::size_t(1) << 18;

// Lines (rows of op(A) or columns of op(B)) cut into `pieces` ranges of whole strips of
// `unit` lines, their strip counts differing by one at most: piece p starts at begin(p).
struct Split {
  int lines, unit, pieces;
  int strips() const { return ceil_div(lines, unit); }
  int begin(int p) const {
    return std::min(lines, int(std::int64_t(strips()) * p / pieces) * unit);
  }
  int size(int p) const { return begin(p + 1) - begin(p); }
  int largest() const { return ceil_div(strips(), pieces) * unit; }
};

// `target` pieces, but at least `least` and at most `most` (and never more than the
// strips), rounded up to a multiple of `threads` where that stays within `most`: equal
// pieces, equal shares.
Split split_lines(int lines, int unit, int least, int target, int most, int threads) {
  const int cap = std::max(1, std::min(most, ceil_div(lines, unit)));
  int pieces = std::clamp(target, std::min(least, cap), cap);
  if (round_up(pieces, threads) <= cap) pieces = round_up(pieces, threads);
  return {lines, unit, pieces};
}

// Waits until the counter `done` (written with release) reaches `value`.
void wait_until(const std::atomic<int>& done, int value) {
  for (int spins = 0; done.load(std::memory_order_acquire) < value; ++spins) {
#if defined(__x86_64__)
    _mm_pause();
#endif
    if (spins > 64) std::this_thread::yield();  // the other thread may not be running
  }
}

// Checks the arguments; false when there is nothing to compute.
bool gemm_has_work(const GemmArgs& g, GemmKernel kernel) {
  PPTRAIN_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "gemm: negative size");
  if (g.M == 0 || g.N == 0) return false;
  PPTRAIN_CHECK(cpu_runs(kernel), std::string("gemm: this CPU cannot run the ") +
                                     gemm_kernel_name(kernel) + " kernel");
  return true;
}

}  // namespace

void gemm_serial(const GemmArgs& g, GemmWorkspace& ws, GemmKernel kernel) {
  if (!gemm_has_work(g, kernel)) return;
  const KernelShape ks = kernel_shape(kernel);
  const int kc_max = std::min(std::max(g.K, 1), kKc);
  float* b = ws.packed_whole(std::size_t(round_up(g.N, ks.nr)) * kc_max);
  float* a = ws.packed_parts(std::size_t(round_up(std::min(g.M, kMcMax), ks.mr)) * kc_max);
  // Each K block reaches all of C before the next: every element's blocks in order.
  for (int k0 = 0; k0 < std::max(g.K, 1); k0 += kKc) {
    const int kc = std::min(kKc, g.K - k0);
    pack_b(g, kernel, 0, g.N, k0, kc, ks.nr, b);
    for (int i0 = 0; i0 < g.M; i0 += kMcMax) {
      const int m = std::min(kMcMax, g.M - i0);
      pack_a(g, kernel, i0, m, k0, kc, ks.mr, a);
      run_tile(g, ks, kc, a, b, i0, 0, m, g.N, k0 == 0 ? g.beta : 1.0f, nullptr, nullptr);
    }
  }
}

void gemm(const GemmArgs& g, GemmWorkspace& ws, GemmKernel kernel, const GemmTileHook& before_tile,
          const GemmTileHook& after_tile, const GemmPackedHook& packed_b) {
  if (!gemm_has_work(g, kernel)) return;
  const KernelShape ks = kernel_shape(kernel);
  const int threads = omp_get_max_threads();
  const int target = kItemsPerThread * threads;
  // The smaller operand is packed whole, a group of K blocks at a time, by all threads
  // together, into one of two slots that the groups take in turn; each item packs its
  // part of the larger one just before using it. Items are tiles of C:
  // - M >= N (op(B) whole): row blocks of about kMcMax rows at most (whose packed op(A)
  //   stays in L2) by column groups, when rows alone give too few items;
  // - M < N (op(A) whole): column blocks of about kChunk columns at most, all rows.
  // Blocks are whole strips, their counts equal to one strip (Split).
  const bool share_b = g.M >= g.N;
  Split rows{g.M, ks.mr, 1}, cols{g.N, ks.nr, 1};
  if (share_b) {
    rows = split_lines(g.M, ks.mr, ceil_div(g.M, kMcMax), target, g.M / kMcMin, threads);
    // Column groups when rows alone give too few items, their count such that the
    // items' count is a multiple of the threads'.
    cols = split_lines(g.N, ks.nr, 1, ceil_div(target, rows.pieces), g.N / 64,
                       rows.pieces % threads == 0 ? 1 : threads);
  } else {
    cols = split_lines(g.N, ks.nr, ceil_div(g.N, kChunk), target, g.N, threads);
  }
  const int row_blocks = rows.pieces, col_blocks = cols.pieces;

  const int k_blocks = std::max(1, ceil_div(g.K, kKc));
  const int kc_max = std::min(std::max(g.K, 1), kKc);
  const int whole_unit = share_b ? ks.nr : ks.mr;
  const int whole_strips = ceil_div(share_b ? g.N : g.M, whole_unit);
  const std::size_t whole_block = std::size_t(whole_strips) * whole_unit * kc_max;
  const int group = std::clamp(int(kWholeFloats / whole_block), 1, k_blocks);
  const std::size_t group_floats = whole_block * group;
  float* whole = ws.packed_whole(group_floats * 2);
  const std::size_t part_floats = std::size_t(share_b ? rows.largest() : cols.largest()) * kc_max;
  float* parts = ws.packed_parts(part_floats * threads);
  const int tiles = row_blocks * col_blocks, groups = ceil_div(k_blocks, group);
  // Counters, all 0: for each tile, the groups that have reached it; for each group, the
  // strips claimed and packed, and the items finished.
  std::atomic<int>* progress = ws.counters(tiles + 3 * groups);
  std::atomic<int>* claimed = progress + tiles;
  std::atomic<int>* packed = claimed + groups;
  std::atomic<int>* finished = packed + groups;

#pragma omp parallel
  {
    float* my_part = parts + part_floats * omp_get_thread_num();
    for (int kb0 = 0; kb0 < k_blocks; kb0 += group) {
      const int blocks = std::min(group, k_blocks - kb0), gi = kb0 / group;
      // Strip w of the group: K block w / whole_strips, strip w % whole_strips.
      const int strips = blocks * whole_strips;
      auto pack_strip_of_group = [&](int w, float* to) {
        const int b = w / whole_strips, strip = w % whole_strips;
        const int k0 = (kb0 + b) * kKc, kc = std::min(kKc, g.K - k0);
        float* dst = to + b * whole_block + std::size_t(strip) * whole_unit * kc;
        if (share_b) {
          pack_b(g, kernel, strip * ks.nr, ks.nr, k0, kc, ks.nr, dst);
          if (packed_b)
            packed_b(kb0 + b, strip * ks.nr, std::min(ks.nr, g.N - strip * ks.nr), kc, ks.nr, dst);
        } else {
          pack_a(g, kernel, strip * ks.mr, ks.mr, k0, kc, ks.mr, dst);
        }
      };
      // The slot was last used by group gi - 2: wait until its items are done, then
      // claim strips until none is left, then wait for the others' strips.
      float* copy = whole + group_floats * (gi % 2);
      if (gi >= 2) wait_until(finished[gi - 2], tiles);
      for (int w; (w = claimed[gi].fetch_add(1, std::memory_order_relaxed)) < strips;) {
        pack_strip_of_group(w, copy);
        packed[gi].fetch_add(1, std::memory_order_release);
      }
      wait_until(packed[gi], strips);
      // No barrier between groups: a thread done with its items of one group goes on to
      // the next. A tile's groups must reach C in order, so an item first waits for its
      // tile's previous group (at most the rest of one item, taken by another thread).
#pragma omp for schedule(dynamic) nowait
      for (int item = 0; item < tiles; ++item) {
        const int i0 = rows.begin(item / col_blocks), m = rows.size(item / col_blocks);
        const int j0 = cols.begin(item % col_blocks), n = cols.size(item % col_blocks);
        wait_until(progress[item], gi);
        for (int b = 0; b < blocks; ++b) {
          const int kb = kb0 + b, k0 = kb * kKc, kc = std::min(kKc, g.K - k0);
          const float* a = copy + b * whole_block + std::size_t(i0) * kc;
          const float* bp = copy + b * whole_block + std::size_t(j0) * kc;
          if (share_b) {
            pack_a(g, kernel, i0, m, k0, kc, ks.mr, my_part);
            a = my_part;
          } else {
            pack_b(g, kernel, j0, n, k0, kc, ks.nr, my_part);
            if (packed_b) packed_b(kb, j0, n, kc, ks.nr, my_part);
            bp = my_part;
          }
          const bool first = kb == 0, last = kb + 1 == k_blocks;
          run_tile(g, ks, kc, a, bp, i0, j0, m, n, first ? g.beta : 1.0f,
                   first && before_tile ? &before_tile : nullptr,
                   last && after_tile ? &after_tile : nullptr);
        }
        progress[item].store(gi + 1, std::memory_order_release);
        finished[gi].fetch_add(1, std::memory_order_release);
      }
    }
  }
}

}  // namespace pptrain::ops::cpu
