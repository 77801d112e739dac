// Fused causal attention, backward (flash-attention-2 style, no atomics). With
// P_ij = exp(scale q_i.k_j - lse_i) for j <= i (the forward's probabilities, rebuilt
// from the saved lse), dP_ij = dO_i.v_j and D_i = dO_i.O_i = sum_j P_ij dP_ij:
//   dS = P * (dP - D)        (gradient of the scaled scores)
//   dV_j = sum_i P_ij dO_i,  dK_j = scale sum_i dS_ij q_i,  dQ_i = scale sum_j dS_ij k_j.
// O is the forward's output, passed in; a warp per query row computes D from it (into
// workspace). Two kernels follow, each owning what it writes: one over the key tiles of
// each key/value head (dK, dV accumulated in registers over the query heads of its
// group, in order, and their query tiles at or below the diagonal) and one over the
// query tiles of each query head (dQ over the key tiles at or left of it). Both rebuild
// S and dP with tensor cores; P and dS go to the second products rounded to bf16.
#include <cmath>

#include "ops/cuda/flash_attention.cuh"
#include "ops/cuda/flash_attention.hpp"

namespace pptrain::ops::cuda {

using namespace flash;

namespace {

// dot[(b*NH+h)*T+t] = dout[b,t,h,:] . o[b,t,h,:]; one warp per (b, t, h).
__global__ void row_dot_kernel(float* dot, const bf16* __restrict__ dout, const bf16* __restrict__ o,
                               int T, int NH, int D, int rows) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b*T + t)*NH + h
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const std::size_t off = static_cast<std::size_t>(row) * D;
  float acc = 0.0f;
  for (int c = lane; c < D; c += 32) acc += to_f32(dout[off + c]) * to_f32(o[off + c]);
  acc = warp_sum(acc);
  if (lane == 0) {
    const int h = row % NH, bt = row / NH, b = bt / T, t = bt % T;
    dot[(static_cast<std::size_t>(b) * NH + h) * T + t] = acc;
  }
}

// For the warp's 16 x kTile tile: P and dS from S and dP (fp32, stride kLdS), rounded
// to bf16 into p (unless null) and ds (stride kLdP); 0 where masked. kKeyRows: rows are
// keys and columns queries (the dK/dV kernel), else the other way round. lse and dot
// are indexed by the query's place: the column (kKeyRows) or the row.
template <bool kKeyRows>
__device__ void probs_and_grads(bf16* p, bf16* ds, const float* s, const float* dp,
                                const float* lse, const float* dot, int row0, int col0, int T,
                                float scale) {
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
#pragma unroll 8
  for (int j = 0; j < kTile / 2; ++j) {
    const int c = 2 * j + half;
    const int query = kKeyRows ? col0 + c : row0 + r, key = kKeyRows ? row0 + r : col0 + c;
    const int qi = kKeyRows ? c : r;
    float pv = 0.0f, dv = 0.0f;
    if (key <= query && query < T) {
      pv = expf(s[r * kLdS + c] * scale - lse[qi]);
      dv = pv * (dp[r * kLdS + c] - dot[qi]);
    }
    if (p != nullptr) p[r * kLdP + c] = __float2bfloat16_rn(pv);
    ds[r * kLdP + c] = __float2bfloat16_rn(dv);
  }
}

// The shared-memory regions of a backward block.
template <int D>
struct BwdRegions {
  bf16 *own0, *own1, *str0, *str1;  // the block's own tile pair; the streamed tile pair
  float *s, *dp;                     // this warp's S, dP (together: its [16][D] result)
  bf16 *p, *ds;                      // this warp's P, dS
  float *lse, *dot;                  // of the kTile queries of the current query tile
  __device__ explicit BwdRegions(unsigned char* m) {
    using L = Smem<D>;
    own0 = reinterpret_cast<bf16*>(m);
    own1 = reinterpret_cast<bf16*>(m + L::tile);
    str0 = reinterpret_cast<bf16*>(m + 2 * L::tile);
    str1 = reinterpret_cast<bf16*>(m + 3 * L::tile);
    unsigned char* w = m + 4 * L::tile + (threadIdx.x / 32) * L::bwd_warp;
    s = reinterpret_cast<float*>(w);
    dp = reinterpret_cast<float*>(w + L::scores);
    p = reinterpret_cast<bf16*>(w + 2 * L::scores);
    ds = reinterpret_cast<bf16*>(w + 2 * L::scores + L::probs);
    lse = reinterpret_cast<float*>(m + 4 * L::tile + kWarps * L::bwd_warp);
    dot = reinterpret_cast<float*>(m + 4 * L::tile + kWarps * L::bwd_warp + L::rows);
  }
};

// Stores acc (times mul) as the warp's 16 rows starting at row0 of dst (stride gld).
template <int D>
__device__ void write_result(bf16* dst, std::size_t gld, int row0, int T, FragC (&acc)[D / 16],
                             float* scratch, float mul) {
  __syncwarp();  // the warp is done reading scratch
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(scratch + 16 * n, acc[n], Smem<D>::kLdO, wmma::mem_row_major);
  __syncwarp();
  store_rows<D>(dst, gld, row0, T, scratch, Smem<D>::kLdO, mul);
}

// dQ for one query tile (warp: 16 queries) over the key tiles at or left of it.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(bf16* dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                    const float* __restrict__ lse, const float* __restrict__ dot, int T, int NH,
                    int NKV, float scale, bool vec) {
  constexpr int ldt = Smem<D>::kLdT;
  const BwdRegions<D> R(dynamic_smem());
  bf16 *q = R.own0, *dO = R.own1, *k = R.str0, *v = R.str1;
  const int warp = threadIdx.x / 32;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest rows go first
  const int C = NH * D;
  const QkvLayout heads{NH, NKV, D, T};
  const std::size_t ld = heads.ld();
  const bf16* keys = qkv + heads.k(b, heads.kv_head(h));
  const bf16* values = qkv + heads.v(b, heads.kv_head(h));
  load_tile<D>(q, qkv + heads.q(b, h), ld, q0, T, vec);
  load_tile<D>(dO, dout + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * D, C,
               q0, T, vec);
  load_rows(R.lse, lse + static_cast<std::size_t>(bh) * T, q0, T);
  load_rows(R.dot, dot + static_cast<std::size_t>(bh) * T, q0, T);
  FragC acc[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  for (int k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous k, v
    load_tile<D>(k, keys, ld, k0, T, vec);
    load_tile<D>(v, values, ld, k0, T, vec);
    __syncthreads();
    product_abt<D>(R.s, q + 16 * warp * ldt, k);    // S = Q_w K^T
    product_abt<D>(R.dp, dO + 16 * warp * ldt, v);  // dP = dO_w V^T
    __syncwarp();
    probs_and_grads<false>(nullptr, R.ds, R.s, R.dp, R.lse + 16 * warp, R.dot + 16 * warp,
                           q0 + 16 * warp, k0, T, scale);
    __syncwarp();
    product_pb<D>(acc, R.ds, k);  // dQ_w += dS K
  }
  write_result<D>(dqkv + heads.q(b, h), ld, q0 + 16 * warp, T, acc, R.s, scale);
}

// dK, dV for one key tile (warp: 16 keys) of one key/value head, over the query heads of
// its group in order and, for each, the query tiles at or below the key tile.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_dkv_kernel(bf16* dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                     const float* __restrict__ lse, const float* __restrict__ dot, int T, int NH,
                     int NKV, float scale, bool vec) {
  constexpr int ldt = Smem<D>::kLdT;
  const BwdRegions<D> R(dynamic_smem());
  bf16 *k = R.own0, *v = R.own1, *q = R.str0, *dO = R.str1;
  const int warp = threadIdx.x / 32;
  const int bkv = blockIdx.x, b = bkv / NKV, kvh = bkv % NKV, group = NH / NKV;
  const int k0 = blockIdx.y * kTile;  // tile 0 meets the most queries: it goes first
  const int C = NH * D;
  const QkvLayout heads{NH, NKV, D, T};
  const std::size_t ld = heads.ld();
  load_tile<D>(k, qkv + heads.k(b, kvh), ld, k0, T, vec);
  load_tile<D>(v, qkv + heads.v(b, kvh), ld, k0, T, vec);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const std::size_t bh = static_cast<std::size_t>(b) * NH + h;
    const bf16* queries = qkv + heads.q(b, h);
    const bf16* dbase = dout + (static_cast<std::size_t>(b) * T * NH + h) * D;
    for (int q0 = k0; q0 < T; q0 += kTile) {
      __syncthreads();  // every warp is done with the previous q, dO, lse, dot
      load_tile<D>(q, queries, ld, q0, T, vec);
      load_tile<D>(dO, dbase, C, q0, T, vec);
      load_rows(R.lse, lse + bh * T, q0, T);
      load_rows(R.dot, dot + bh * T, q0, T);
      __syncthreads();
      product_abt<D>(R.s, k + 16 * warp * ldt, q);    // S^T = K_w Q^T
      product_abt<D>(R.dp, v + 16 * warp * ldt, dO);  // dP^T = V_w dO^T
      __syncwarp();
      probs_and_grads<true>(R.p, R.ds, R.s, R.dp, R.lse, R.dot, k0 + 16 * warp, q0, T, scale);
      __syncwarp();
      product_pb<D>(dv, R.p, dO);  // dV_w += P^T dO
      product_pb<D>(dk, R.ds, q);  // dK_w += dS^T Q
    }
  }
  write_result<D>(dqkv + heads.k(b, kvh), ld, k0 + 16 * warp, T, dk, R.s, scale);
  write_result<D>(dqkv + heads.v(b, kvh), ld, k0 + 16 * warp, T, dv, R.s, 1.0f);
}

}  // namespace

std::size_t flash_attention_backward_workspace_bytes(int B, int T, int NH) {
  return cuda_attention_scratch_bytes(true, true, false, DType::BF16, B, T, NH, 0);
}

void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, void* workspace, int B, int T, int NH, int NKV,
                              int hs, cudaStream_t s) {
  const char* op = "flash_attention_backward";
  PPTRAIN_CHECK(B > 0 && T > 0 && NH > 0 && NKV > 0, std::string(op) + ": non-positive size");
  PPTRAIN_CHECK(NH % NKV == 0, std::string(op) + ": NH must be a multiple of NKV");
  PPTRAIN_CHECK(dqkv && dout && qkv && out && lse && workspace, std::string(op) + ": null pointer");
  const long long rows = static_cast<long long>(B) * T * NH;
  PPTRAIN_CHECK(rows < (1LL << 31) && T <= 65535 * kTile, std::string(op) + ": too many rows");
  // D = rowsum(dO * O).
  auto* dot = static_cast<float*>(workspace);
  constexpr int kDotThreads = 256;
  const unsigned dot_blocks =
      static_cast<unsigned>((rows + kDotThreads / 32 - 1) / (kDotThreads / 32));
  row_dot_kernel<<<dot_blocks, kDotThreads, 0, s>>>(dot, dout, out, T, NH, hs,
                                                    static_cast<int>(rows));
  PPTRAIN_CUDA_CHECK_LAUNCH();

  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const unsigned tiles = (T + kTile - 1) / kTile;
  const dim3 q_grid(B * NH, tiles), kv_grid(B * NKV, tiles);
  const bool vec = aligned16({qkv, dout});
  const bool known = with_head_size(hs, [&](auto d) {
    constexpr int D = decltype(d)::value;
    constexpr std::size_t bytes = Smem<D>::bwd;
    allow_smem(flash_dq_kernel<D>, bytes);
    flash_dq_kernel<D>
        <<<q_grid, kThreads, bytes, s>>>(dqkv, dout, qkv, lse, dot, T, NH, NKV, scale, vec);
    PPTRAIN_CUDA_CHECK_LAUNCH();
    allow_smem(flash_dkv_kernel<D>, bytes);
    flash_dkv_kernel<D>
        <<<kv_grid, kThreads, bytes, s>>>(dqkv, dout, qkv, lse, dot, T, NH, NKV, scale, vec);
    PPTRAIN_CUDA_CHECK_LAUNCH();
  });
  PPTRAIN_CHECK(known, std::string(op) + ": unsupported head size");
}

}  // namespace pptrain::ops::cuda
