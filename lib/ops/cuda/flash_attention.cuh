// Device pieces shared by the fused attention kernels: tile sizes, the shared-memory
// layout (sized on the host from the same constants), tile fetches from the interleaved
// qkv / out layouts, the warp-level tensor-core products on register fragments
// (warp_mma.cuh: mma.sync bf16 m16n8k16, fp32 accumulators) and the head-size dispatch.
//
// A block has kWarps warps and works on one tile of kTile rows: of queries of one
// (batch, query head) in the forward and dQ kernels, of keys of one (batch, key/value
// head) in the dK/dV kernel; warp w owns rows [16w, 16w+16) of it and keeps their
// products in registers. Per step it meets one tile of kTile columns (keys or queries),
// fetched into shared memory by the whole block with cp.async, double-buffered: the
// next tile is in flight while the current one is used, and warps meet only at the
// block barrier after each fetch lands and after each tile is used.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ops/cuda/flash_attention.hpp"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/warp_mma.cuh"

namespace pptrain::ops::cuda::flash {

using bf16 = __nv_bfloat16;

inline constexpr int kTile = 64;  // rows and columns of a tile
inline constexpr int kWarps = kTile / 16;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kBlocks = kTile / 8;  // 8-column blocks of a warp's [16][kTile] scores
inline constexpr float kLog2e = 1.4426950408889634f;

constexpr std::size_t round_up(std::size_t n) { return (n + 127) / 128 * 128; }

// Shared memory: bf16 [kTile][D] tiles with row stride D + 8 (16-byte rows whose eight
// consecutive rows start in eight different bank groups: ldmatrix without conflicts).
template <int D>
struct Smem {
  static constexpr int kLd = D + 8;
  static constexpr int kElems = kTile * kLd;  // a tile's elements (a multiple of 8)
  static constexpr std::size_t tile = round_up(std::size_t(kElems) * sizeof(bf16));
  // Forward: q, and k and v twice. Backward: the block's own two tiles (q, dO or k, v)
  // and the streamed pair twice, then the lse and D of kTile queries twice.
  static constexpr std::size_t fwd = 5 * tile;
  static constexpr std::size_t bwd = 6 * tile + 4 * kTile * sizeof(float);
};

// The rows a launch reads, as flash_attention.hpp's FlashRows give them, with the head
// layout: row 0 of sequence b's query head h, key and value head g; and which keys each
// query sees, causal by position in the whole sequence (query i of the query rows and key
// j of the key rows are at positions q.first + i and kv.first + j).
struct Pieces {
  FlashRows q, kv;
  int NH, NKV, D;
  __device__ std::size_t q_at(int b, int h) const {
    return static_cast<std::size_t>(b) * q.len * q.ld + static_cast<std::size_t>(h) * D;
  }
  __device__ std::size_t k_at(int b, int g) const {
    return static_cast<std::size_t>(b) * kv.len * kv.ld + kv.k_col + static_cast<std::size_t>(g) * D;
  }
  __device__ std::size_t v_at(int b, int g) const { return k_at(b, g) - kv.k_col + kv.v_col; }
  // Row 0 of sequence b's head h in an output of the query rows' shape, [B, q.len, NH*D].
  __device__ std::size_t out_at(int b, int h) const {
    return (static_cast<std::size_t>(b) * q.len * NH + h) * D;
  }
  // The key/value head of query head h.
  __device__ int kv_head(int h) const { return h / (NH / NKV); }
  __device__ bool sees(int query, int key) const {
    return key <= query + q.first - kv.first && key < kv.len && query < q.len;
  }
  // The end of the keys that any query of the tile [q0, q0 + kTile) sees.
  __device__ int keys_end(int q0) const {
    return max(0, min(kv.len, q0 + kTile + q.first - kv.first));
  }
  // The first query tile that holds a query seeing key k0.
  __device__ int first_query_tile(int k0) const {
    const int query = k0 - (q.first - kv.first);
    return query <= 0 ? 0 : query / kTile * kTile;
  }
};

__device__ __forceinline__ bf16* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char flash_smem[];
  return reinterpret_cast<bf16*>(flash_smem);
}

// Rows [row0, row0 + kTile) of the [T, ld] matrix at src (its first D columns) into
// tile (row stride D+8), zeros for rows >= T: with cp.async (the caller commits and
// waits), or, when !vec (src or ld not 16-byte aligned), with element loads that land
// at once.
template <int D>
__device__ void fetch_tile(bf16* tile, const bf16* src, std::size_t ld, int row0, int T, bool vec) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks * 8;
    const bool inside = row0 + r < T;
    const bf16* from = inside ? src + static_cast<std::size_t>(row0 + r) * ld + c : src;
    bf16* to = tile + r * Smem<D>::kLd + c;
    if (vec) {
      ptx::cp_async_16(to, from, inside);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) to[e] = inside ? from[e] : __float2bfloat16_rn(0.0f);
    }
  }
}

// Double buffering: starts fetch_next() (the next step's cp.async fetches into the other
// buffer, freed at the last step's closing barrier) when there is a next step, then waits
// until only those are in flight: the current step's tiles have landed for this thread
// (the caller's barrier follows, for everyone's).
template <typename F>
__device__ void land_current(bool has_next, F&& fetch_next) {
  if (has_next) {
    fetch_next();
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
  } else {
    ptx::cp_async_wait<0>();
  }
}

// The A fragments of the warp's 16 rows of a tile (a: its first row), D/16 k-steps.
template <int D>
__device__ void load_a(std::uint32_t (&af)[D / 16][4], const bf16* a) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ptx::ldmatrix_x4(af[kk], a + (lane % 16) * Smem<D>::kLd + 16 * kk + lane / 16 * 8);
}

// acc[n] += A b^T for column block n (rows 8n.. of the tile b), A the warp's [16][D]
// fragments: a [16][kTile] product such as S = Q K^T.
template <int D>
__device__ void product_abt(float (&acc)[kBlocks][4], const std::uint32_t (&af)[D / 16][4],
                            const bf16* b) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kBlocks; n += 2)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t bf[4];  // row blocks n and n+1 of b, columns 16kk.. and 16kk+8..
      ptx::ldmatrix_x4(bf, b + (8 * n + lane % 8 + lane / 16 * 8) * Smem<D>::kLd + 16 * kk +
                               lane / 8 % 2 * 8);
      const std::uint32_t lo[2] = {bf[0], bf[1]}, hi[2] = {bf[2], bf[3]};
      ptx::mma_bf16_16816(acc[n], af[kk], lo, acc[n]);
      ptx::mma_bf16_16816(acc[n + 1], af[kk], hi, acc[n + 1]);
    }
}

// acc[d] += P b for column block d of D, P the warp's [16][kTile] fp32 accumulators
// (rounded to bf16: blocks 2kk and 2kk+1 of P are the A fragment of k-step kk) and b a
// [kTile][D] tile read transposed (ldmatrix .trans).
template <int D>
__device__ void product_pb(float (&acc)[D / 8][4], const float (&p)[kBlocks][4], const bf16* b) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const std::uint32_t pf[4] = {ptx::pack_bf16(p[2 * kk][0], p[2 * kk][1]),
                                 ptx::pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                                 ptx::pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                 ptx::pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int d = 0; d < D / 8; d += 2) {
      std::uint32_t bf[4];  // rows 16kk.. and 16kk+8.. of column blocks d and d+1
      ptx::ldmatrix_x4_trans(bf, b + (16 * kk + lane % 8 + lane / 8 % 2 * 8) * Smem<D>::kLd +
                                     8 * d + lane / 16 * 8);
      const std::uint32_t lo[2] = {bf[0], bf[1]}, hi[2] = {bf[2], bf[3]};
      ptx::mma_bf16_16816(acc[d], pf, lo, acc[d]);
      ptx::mma_bf16_16816(acc[d + 1], pf, hi, acc[d + 1]);
    }
  }
}

// The warp's [16][D] accumulators times mul, rounded to bf16, to rows row0.. of dst (row
// stride ld) that are < T; with `add`, added to what dst holds.
template <int D>
__device__ void store_rows(bf16* dst, std::size_t ld, int row0, int T, const float (&acc)[D / 8][4],
                           float mul, bool add) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= T) continue;
    bf16* d_row = dst + static_cast<std::size_t>(row) * ld + 2 * t;
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = acc[d][2 * half + e] * mul;
        d_row[8 * d + e] = __float2bfloat16_rn(add ? __bfloat162float(d_row[8 * d + e]) + x : x);
      }
  }
}

// f(std::integral_constant<int, D>{}) for the supported head sizes, the multiples of 16
// up to 128 (ops.hpp's cuda_fused_attention_head_size); false otherwise.
template <int D = 16, typename F>
bool with_head_size(int hs, F&& f) {
  if constexpr (D > 128) {
    return false;
  } else {
    if (hs != D) return with_head_size<D + 16>(hs, f);
    f(std::integral_constant<int, D>{});
    return true;
  }
}

}  // namespace pptrain::ops::cuda::flash
