// The CPU backend's own GEMM (ops/cpu/cpu_gemm.hpp) against the summation order its header
// promises, bit for bit: every micro-kernel this CPU runs, every transpose, padded leading
// dimensions, shapes that leave partial tiles, strips and K blocks, both ways of sharing
// operands, several groups of K blocks, 1 to 3 threads, and gemm_serial. Equal bits to a
// scalar loop of std::fma (correctly rounded on every machine) mean equal bits on every
// machine.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/cpu/cpu_gemm.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops::cpu {
namespace {

using pptrain::ops::testing::randn;

struct Problem {
  int M, N, K;
  bool ta, tb;
  float alpha, beta;
  int pad;  // added to every leading dimension
};

struct Operands {
  int lda, ldb, ldc;
  std::vector<float> A, B, C0;
};

Operands operands(const Problem& p, uint64_t seed) {
  Operands o;
  o.lda = (p.ta ? p.M : p.K) + p.pad;
  o.ldb = (p.tb ? p.K : p.N) + p.pad;
  o.ldc = p.N + p.pad;
  o.A = randn(std::size_t(p.ta ? p.K : p.M) * o.lda, seed);
  o.B = randn(std::size_t(p.tb ? p.N : p.K) * o.ldb, seed + 1);
  o.C0 = randn(std::size_t(p.M) * o.ldc, seed + 2);
  if (p.beta == 0.0f)  // C is only written: garbage must not leak in
    for (float& c : o.C0) c = std::numeric_limits<float>::quiet_NaN();
  return o;
}

// The header's order: per K block, acc = fma chain from 0 over the block's k in order;
// C = fma(beta, C, alpha acc) after the first block (alpha acc when beta is 0), then
// C + alpha acc.
std::vector<float> reference(const Problem& p, const Operands& o) {
  std::vector<float> C = o.C0;
  for (int i = 0; i < p.M; ++i)
    for (int j = 0; j < p.N; ++j) {
      float& c = C[std::size_t(i) * o.ldc + j];
      for (int k0 = 0; k0 < std::max(p.K, 1); k0 += kGemmKBlock) {
        float acc = 0.0f;
        for (int k = k0; k < std::min(p.K, k0 + kGemmKBlock); ++k) {
          const float a = p.ta ? o.A[std::size_t(k) * o.lda + i] : o.A[std::size_t(i) * o.lda + k];
          const float b = p.tb ? o.B[std::size_t(j) * o.ldb + k] : o.B[std::size_t(k) * o.ldb + j];
          acc = std::fma(a, b, acc);
        }
        const float t = p.alpha * acc;
        if (k0 > 0)
          c = c + t;
        else
          c = p.beta == 0.0f ? t : std::fma(p.beta, c, t);
      }
    }
  return C;
}

std::vector<float> run(const Problem& p, const Operands& o, GemmKernel kernel, int threads) {
  std::vector<float> C = o.C0;
  const GemmArgs args{p.ta, p.tb, p.M, p.N, p.K, p.alpha, o.A.data(), o.lda, o.B.data(),
                      o.ldb, p.beta, C.data(), o.ldc};
  GemmWorkspace ws;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  gemm(args, ws, kernel);
  omp_set_num_threads(before);
  return C;
}

// gemm_serial: the calling thread alone.
std::vector<float> run_serial(const Problem& p, const Operands& o, GemmKernel kernel) {
  std::vector<float> C = o.C0;
  GemmWorkspace ws;
  gemm_serial({p.ta, p.tb, p.M, p.N, p.K, p.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, p.beta,
               C.data(), o.ldc},
              ws, kernel);
  return C;
}

// Bit equality, padding included (it must be untouched), NaN compared as bits.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t differ = 0, first = 0;
  for (std::size_t e = 0; e < got.size(); ++e)
    if (std::memcmp(&got[e], &want[e], sizeof(float)) != 0 && differ++ == 0) first = e;
  EXPECT_EQ(differ, 0u) << what << ": first at " << first << ": " << got[first] << " against "
                        << want[first];
}

std::vector<GemmKernel> kernels_here() {
  std::vector<GemmKernel> out;
  for (GemmKernel k : {GemmKernel::portable, GemmKernel::avx2, GemmKernel::avx512})
    if (cpu_runs(k)) out.push_back(k);
  return out;
}

int round_up_to(int n, int unit) { return (n + unit - 1) / unit * unit; }

std::string describe(const Problem& p, GemmKernel kernel, int threads) {
  return std::to_string(p.M) + "x" + std::to_string(p.N) + "x" + std::to_string(p.K) +
         " ta " + std::to_string(p.ta) + " tb " + std::to_string(p.tb) + " beta " +
         std::to_string(p.beta) + " pad " + std::to_string(p.pad) + " " +
         gemm_kernel_name(kernel) + " on " + std::to_string(threads) + " threads";
}

TEST(CpuGemm, EveryKernelFollowsTheDocumentedOrderBitForBit) {
  struct Shape {
    int M, N, K;
  };
  // Partial strips and tiles (last strips of every count of lines from 1 to 15), K of 0,
  // 1 and across blocks; M < N and M >= N.
  const Shape shapes[] = {{1, 1, 1},     {5, 7, 3},     {13, 33, 0},  {13, 33, 257},
                          {37, 70, 600}, {70, 37, 513}, {3, 300, 40}, {300, 3, 40},
                          {23, 39, 40},  {39, 23, 41},  {28, 45, 17}, {45, 28, 19}};
  uint64_t seed = 100;
  for (const Shape& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 0.75f}) {
          const Problem p{s.M, s.N, s.K, ta, tb, 0.5f, beta, (s.M + s.N) % 2 ? 3 : 0};
          const Operands o = operands(p, seed += 3);
          const std::vector<float> want = reference(p, o);
          for (GemmKernel kernel : kernels_here()) {
            for (int threads : {1, 2, 3})
              expect_same_bits(run(p, o, kernel, threads), want, describe(p, kernel, threads));
            expect_same_bits(run_serial(p, o, kernel), want, describe(p, kernel, 1) + " serial");
          }
        }
}

// The smaller operand is packed a group of K blocks at a time; a large one takes a group
// per block; the two slots are reused, and a tile's groups must reach C in order
// whichever thread takes them.
TEST(CpuGemm, ManyGroupsOfKBlocksFollowTheSameOrder) {
  for (const auto& [M, N] : {std::pair{520, 530}, std::pair{530, 520}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Problem p{M, N, 3 * kGemmKBlock + 5, ta, tb, 1.0f, 1.0f, 1};
        const Operands o = operands(p, 7 + M);
        const std::vector<float> want = reference(p, o);
        for (int threads : {2, 3, 4})
          expect_same_bits(run(p, o, best_gemm_kernel(), threads), want,
                           describe(p, best_gemm_kernel(), threads));
      }
}

// The tile hooks (CpuOps::linear_forward's bias and GELU): before_tile runs on each tile
// before any product reaches it, after_tile once the tile is final, and the tiles cover C
// once.
TEST(CpuGemm, TileHooksSeeEachTileBeforeAndAfterItsProduct) {
  for (const auto& [M, N] : {std::pair{70, 300}, std::pair{300, 70}}) {
    const Problem p{M, N, 600, false, false, 1.0f, 1.0f, 0};
    Operands o = operands(p, 11);
    std::fill(o.C0.begin(), o.C0.end(), 0.0f);
    Operands biased = o;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) biased.C0[std::size_t(i) * N + j] = 0.25f * j;
    const std::vector<float> want = reference(p, biased);

    std::vector<float> C(std::size_t(M) * N, std::numeric_limits<float>::quiet_NaN());
    std::vector<int> before_count(C.size()), after_count(C.size());
    std::vector<float> seen_after(C.size());
    auto before = [&](int i0, int j0, int m, int n) {
      for (int i = i0; i < i0 + m; ++i)
        for (int j = j0; j < j0 + n; ++j) {
          C[std::size_t(i) * N + j] = 0.25f * j;
          ++before_count[std::size_t(i) * N + j];
        }
    };
    auto after = [&](int i0, int j0, int m, int n) {
      for (int i = i0; i < i0 + m; ++i)
        for (int j = j0; j < j0 + n; ++j) {
          seen_after[std::size_t(i) * N + j] = C[std::size_t(i) * N + j];
          ++after_count[std::size_t(i) * N + j];
        }
    };
    const GemmArgs args{false, false, M, N, p.K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb,
                        1.0f, C.data(), N};
    GemmWorkspace ws;
    omp_set_num_threads(2);
    gemm(args, ws, best_gemm_kernel(), before, after);
    for (std::size_t e = 0; e < C.size(); ++e) {
      ASSERT_EQ(before_count[e], 1) << e;
      ASSERT_EQ(after_count[e], 1) << e;
    }
    expect_same_bits(C, want, "result with hooks");
    expect_same_bits(seen_after, want, "what after_tile saw");
  }
}


// The packed-op(B) hook (CpuOps::linear_grads' bias sums): every column of every K block
// once, holding op(B)'s values (zeros past the columns handed over), for both ways of
// sharing operands and any thread count; the product is unchanged.
TEST(CpuGemm, PackedHookHandsOverEveryColumnOfEveryKBlockOnce) {
  for (const auto& [M, N] : {std::pair{70, 300}, std::pair{300, 70}, std::pair{40, 40}})
    for (bool tb : {false, true})
      for (int threads : {1, 2, 3}) {
        const Problem p{M, N, 2 * kGemmKBlock + 37, true, tb, 1.0f, 1.0f, 0};
        const Operands o = operands(p, 13 + M);
        const int blocks = (p.K + kGemmKBlock - 1) / kGemmKBlock;
        std::vector<int> count(std::size_t(blocks) * N);
        std::atomic<int> wrong{0};
        const GemmPackedHook hook = [&](int kb, int j0, int n, int kc, int nr,
                                        const float* strips) {
          for (int c = 0; c < round_up_to(n, nr); ++c) {
            const float* strip = strips + std::size_t(c / nr) * nr * kc;
            for (int k = 0; k < kc; ++k) {
              const int kk = kb * kGemmKBlock + k, j = j0 + c;
              const float want = c >= n ? 0.0f
                                 : tb   ? o.B[std::size_t(j) * o.ldb + kk]
                                        : o.B[std::size_t(kk) * o.ldb + j];
              wrong += strip[std::size_t(k) * nr + c % nr] != want;
            }
#pragma omp critical
            if (c < n) ++count[std::size_t(kb) * N + j0 + c];
          }
        };
        std::vector<float> C = o.C0;
        const GemmArgs args{p.ta, p.tb, M, N, p.K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb,
                            1.0f, C.data(), o.ldc};
        GemmWorkspace ws;
        const int before = omp_get_max_threads();
        omp_set_num_threads(threads);
        gemm(args, ws, best_gemm_kernel(), {}, {}, hook);
        omp_set_num_threads(before);
        const std::string what = describe(p, best_gemm_kernel(), threads);
        EXPECT_EQ(wrong.load(), 0) << what;
        for (std::size_t e = 0; e < count.size(); ++e) ASSERT_EQ(count[e], 1) << what << " at " << e;
        expect_same_bits(C, reference(p, o), what);
      }
}

}  // namespace
}  // namespace pptrain::ops::cpu
