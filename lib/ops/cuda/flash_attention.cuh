// Device pieces shared by the fused attention kernels: tile sizes, the shared-memory
// layouts (sized on the host from the same constants), tile loads from the interleaved
// qkv / out layouts, the warp-level tensor-core products (nvcuda::wmma, bf16 16x16x16
// fragments, fp32 accumulators) and the head-size dispatch.
//
// A block has kWarps warps and works on one tile of kTile rows: of queries of one
// (batch, query head) in the forward and dQ kernels, of keys of one (batch, key/value
// head) in the dK/dV kernel; warp w owns rows
// [16w, 16w+16) of it. Per step it meets one tile of kTile columns (keys or queries),
// staged in shared memory by the whole block; everything after the staging is
// warp-private, so warps only meet at the block barriers around the staging.
#pragma once
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "ops/cuda/flash_attention.hpp"
#include "ops/cuda/kernel_util.cuh"

namespace pptrain::ops::cuda::flash {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

inline constexpr int kTile = 64;  // rows and columns of a tile
inline constexpr int kWarps = kTile / 16;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kLdS = kTile + 4;  // row stride of a warp's fp32 [16][kTile] scores
inline constexpr int kLdP = kTile + 8;  // row stride of a warp's bf16 [16][kTile] probabilities

constexpr std::size_t round_up(std::size_t n) { return (n + 127) / 128 * 128; }

// Shared memory, in 128-byte aligned regions. A bf16 [kTile][D] tile has row stride
// D + 8 (16-byte rows, fewer bank conflicts).
template <int D>
struct Smem {
  static constexpr int kLdT = D + 8;
  static constexpr int kLdO = D + 4;  // fp32 [16][D] results
  static constexpr std::size_t tile = round_up(std::size_t(kTile) * kLdT * sizeof(bf16));
  static constexpr std::size_t scores = round_up(16 * kLdS * sizeof(float));
  static constexpr std::size_t probs = round_up(16 * kLdP * sizeof(bf16));
  static constexpr std::size_t result = round_up(16 * kLdO * sizeof(float));
  static constexpr std::size_t rows = round_up(kTile * sizeof(float));
  // Forward: tiles q, and k and v twice (double-buffered); the rest is in registers.
  static constexpr std::size_t fwd = 5 * tile;
  // Backward: tiles (q, dO, k, v); per warp scores and dP (together also the [16][D]
  // result at the end), two probability-like bf16 arrays; lse and D of kTile queries.
  static constexpr std::size_t bwd_warp = 2 * scores + 2 * probs;
  static constexpr std::size_t bwd = 4 * tile + kWarps * bwd_warp + 2 * rows;
  static_assert(result <= 2 * scores, "the [16][D] result must fit in scores + dP");
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

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char flash_smem[];
  return flash_smem;
}

// Rows [row0, row0 + kTile) of the [T, ld] matrix at src (its first D columns) into
// tile[kTile][D+8]; rows >= T become zeros. vec: src and ld allow 16-byte loads.
template <int D>
__device__ void load_tile(bf16* tile, const bf16* src, std::size_t ld, int row0, int T, bool vec) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks * 8;
    Pack<bf16, 8> v;
    if (row0 + r < T) {
      const bf16* p = src + static_cast<std::size_t>(row0 + r) * ld + c;
      if (vec) {
        v = load_pack<8>(p);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v.v[e] = p[e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v.v[e] = __float2bfloat16_rn(0.0f);
    }
    store_pack<8>(tile + r * Smem<D>::kLdT + c, v);
  }
}

// dst[r] = src[row0 + r] for the kTile rows (0 for rows >= T).
__device__ inline void load_rows(float* dst, const float* src, int row0, int T) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) dst[r] = row0 + r < T ? src[row0 + r] : 0.0f;
}

// The warp's 16 rows of src (fp32, stride ld) times mul, rounded to bf16, to rows
// row0.. of dst (row stride gld) that are < T; with `add`, added to what dst holds.
template <int D>
__device__ void store_rows(bf16* dst, std::size_t gld, int row0, int T, const float* src, int ld,
                           float mul, bool add) {
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < 16 * D; e += 32) {
    const int r = e / D, c = e % D;
    if (row0 + r >= T) continue;
    bf16& d = dst[static_cast<std::size_t>(row0 + r) * gld + c];
    const float x = src[r * ld + c] * mul;
    d = __float2bfloat16_rn(add ? __bfloat162float(d) + x : x);
  }
}

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// out[16][kTile] (fp32, stride kLdS) = a[16][D] @ b[kTile][D]^T; a and b are rows of
// bf16 tiles (stride D+8). b read column-major is b^T.
template <int D>
__device__ void product_abt(float* out, const bf16* a, const bf16* b) {
  constexpr int ld = Smem<D>::kLdT;
  FragA fa[D / 16];
#pragma unroll
  for (int k = 0; k < D / 16; ++k) wmma::load_matrix_sync(fa[k], a + 16 * k, ld);
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      FragBCol fb;
      wmma::load_matrix_sync(fb, b + 16 * n * ld + 16 * k, ld);
      wmma::mma_sync(acc, fa[k], fb, acc);
    }
    wmma::store_matrix_sync(out + 16 * n, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] += p[16][kTile] @ b[kTile][D], column block n of 16; p is bf16 with stride
// kLdP, b a bf16 tile (stride D+8).
template <int D>
__device__ void product_pb(FragC (&acc)[D / 16], const bf16* p, const bf16* b) {
  constexpr int ld = Smem<D>::kLdT;
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + 16 * k, kLdP);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + 16 * k * ld + 16 * n, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
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

// Lets `kernel` use `bytes` of dynamic shared memory (above the 48 KiB default).
template <typename K>
void allow_smem(K* kernel, std::size_t bytes) {
  PPTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
}

}  // namespace pptrain::ops::cuda::flash
