// The CPU backend's fp32 GEMM: C = alpha op(A) op(B) + beta C, row-major, blocked in the
// manner of Goto and BLIS. Operands are packed per K block into strips (MR rows of op(A),
// NR columns of op(B)) that a register-tiled micro-kernel (MR x NR) multiplies. The
// smaller operand is packed whole, a few K blocks at a time, by all threads together;
// work items are tiles of C, handed out dynamically, and each packs its part of the
// larger operand just before using it. No thread waits at a barrier inside a call: an
// item waits only for its group's packed operand and its tile's previous group.
//
// Every element of C is a sum over K blocks of kGemmKBlock, in order: acc = 0, then
// acc = fma(a_k, b_k, acc) over the block's k in order, then C = fma(beta, C, alpha acc)
// after the first block (alpha acc alone when beta is 0) and C + alpha acc after the
// others. Nothing in that depends on the thread count, the tile an element falls in, or
// the micro-kernel (AVX-512, AVX2 or the portable one), so results are bit-identical for
// every thread count and on every machine.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "core/aligned_buffer.hpp"

namespace pptrain::ops::cpu {

// The depth of a K block: it fixes the summation order, so it is part of every result.
inline constexpr int kGemmKBlock = 256;

enum class GemmKernel { portable, avx2, avx512 };

// The fastest micro-kernel this CPU runs (AVX-512 F, AVX2 + FMA, else portable).
GemmKernel best_gemm_kernel();
bool cpu_runs(GemmKernel kernel);
const char* gemm_kernel_name(GemmKernel kernel);

// Called on a tile of C (rows i0.., columns j0.., m x n) by the thread that computes it:
// before_tile before its first K block is added, after_tile once its last one is, each
// while the tile is in the core's cache. The tiles cut C into disjoint pieces.
using GemmTileHook = std::function<void(int i0, int j0, int m, int n)>;

// Called on op(B) as the product packs it, by the packing thread: columns j0..j0+n of K
// block kb (depth kc) as strips of nr columns, each kc x nr floats, k-major (columns of a
// strip past n are 0). Every column of every K block is handed over exactly once.
using GemmPackedHook =
    std::function<void(int kb, int j0, int n, int kc, int nr, const float* strips)>;

// Packing buffers (aligned, contents undefined) and the counters that order
// the threads' work, grown on demand and kept between calls (one per CpuOps).
class GemmWorkspace {
 public:
  float* packed_whole(std::size_t floats);  // the smaller operand, two groups' slots
  float* packed_parts(std::size_t floats);  // every thread's part of the larger one
  std::atomic<int>* counters(int n);        // n counters, all 0

 private:
  AlignedBuffer<float> whole_, parts_;
  std::unique_ptr<std::atomic<int>[]> counters_;
  int counters_size_ = 0;
};

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const float* A = nullptr;  // M x K (K x M when trans_a), leading dimension lda
  int lda = 0;
  const float* B = nullptr;  // K x N (N x K when trans_b), leading dimension ldb
  int ldb = 0;
  float beta = 0.0f;  // 0: C is only written (it may hold garbage)
  float* C = nullptr;  // M x N, leading dimension ldc
  int ldc = 0;
};

// On the OpenMP threads. Hooks may be empty.
void gemm(const GemmArgs& args, GemmWorkspace& ws, GemmKernel kernel = best_gemm_kernel(),
          const GemmTileHook& before_tile = {}, const GemmTileHook& after_tile = {},
          const GemmPackedHook& packed_b = {});

// The same product, in the same order (so the same bits), on the calling thread alone:
// for small products inside a parallel region, each thread with its own workspace.
void gemm_serial(const GemmArgs& args, GemmWorkspace& ws, GemmKernel kernel = best_gemm_kernel());

}  // namespace pptrain::ops::cpu
