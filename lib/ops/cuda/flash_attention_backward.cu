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
// S and dP with tensor cores; P and dS go to the second products rounded to bf16. A
// ring step runs the same kernels on a piece of queries against a piece of keys, causal
// by position, and adds its gradients to what dq and dkv hold.
#include <cmath>
#include <string>

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
// to bf16 into p (unless null) and ds (stride kLdP); 0 where the query does not see the
// key. kKeyRows: rows are keys and columns queries (the dK/dV kernel), else the other
// way round. lse and dot are indexed by the query's place: the column (kKeyRows) or the
// row.
template <bool kKeyRows>
__device__ void probs_and_grads(bf16* p, bf16* ds, const float* s, const float* dp,
                                const float* lse, const float* dot, int row0, int col0,
                                const Pieces& at, float scale) {
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
#pragma unroll 8
  for (int j = 0; j < kTile / 2; ++j) {
    const int c = 2 * j + half;
    const int query = kKeyRows ? col0 + c : row0 + r, key = kKeyRows ? row0 + r : col0 + c;
    const int qi = kKeyRows ? c : r;
    float pv = 0.0f, dv = 0.0f;
    if (at.sees(query, key)) {
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

// Stores acc (times mul) as the warp's 16 rows starting at row0 of dst (stride gld), or
// adds it (`add`).
template <int D>
__device__ void write_result(bf16* dst, std::size_t gld, int row0, int T, FragC (&acc)[D / 16],
                             float* scratch, float mul, bool add) {
  __syncwarp();  // the warp is done reading scratch
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(scratch + 16 * n, acc[n], Smem<D>::kLdO, wmma::mem_row_major);
  __syncwarp();
  store_rows<D>(dst, gld, row0, T, scratch, Smem<D>::kLdO, mul, add);
}

// dQ for one query tile (warp: 16 queries) over the key tiles its queries see.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(bf16* dq, const bf16* __restrict__ dout, const bf16* __restrict__ q_rows,
                    const bf16* __restrict__ kv_rows, const float* __restrict__ lse,
                    const float* __restrict__ dot, Pieces at, float scale, bool add, bool vec) {
  constexpr int ldt = Smem<D>::kLdT;
  const BwdRegions<D> R(dynamic_smem());
  bf16 *q = R.own0, *dO = R.own1, *k = R.str0, *v = R.str1;
  const int warp = threadIdx.x / 32;
  const int bh = blockIdx.x, b = bh / at.NH, h = bh % at.NH, q_len = at.q.len;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest rows go first
  const bf16* keys = kv_rows + at.k_at(b, at.kv_head(h));
  const bf16* values = kv_rows + at.v_at(b, at.kv_head(h));
  load_tile<D>(q, q_rows + at.q_at(b, h), at.q.ld, q0, q_len, vec);
  load_tile<D>(dO, dout + at.out_at(b, h), at.NH * D, q0, q_len, vec);
  load_rows(R.lse, lse + static_cast<std::size_t>(bh) * q_len, q0, q_len);
  load_rows(R.dot, dot + static_cast<std::size_t>(bh) * q_len, q0, q_len);
  FragC acc[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  for (int k0 = 0; k0 < at.keys_end(q0); k0 += kTile) {
    __syncthreads();  // every warp is done with the previous k, v
    load_tile<D>(k, keys, at.kv.ld, k0, at.kv.len, vec);
    load_tile<D>(v, values, at.kv.ld, k0, at.kv.len, vec);
    __syncthreads();
    product_abt<D>(R.s, q + 16 * warp * ldt, k);    // S = Q_w K^T
    product_abt<D>(R.dp, dO + 16 * warp * ldt, v);  // dP = dO_w V^T
    __syncwarp();
    probs_and_grads<false>(nullptr, R.ds, R.s, R.dp, R.lse + 16 * warp, R.dot + 16 * warp,
                           q0 + 16 * warp, k0, at, scale);
    __syncwarp();
    product_pb<D>(acc, R.ds, k);  // dQ_w += dS K
  }
  write_result<D>(dq + at.q_at(b, h), at.q.ld, q0 + 16 * warp, q_len, acc, R.s, scale, add);
}

// dK, dV for one key tile (warp: 16 keys) of one key/value head, over the query heads of
// its group in order and, for each, the query tiles that see the key tile.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_dkv_kernel(bf16* dkv, const bf16* __restrict__ dout, const bf16* __restrict__ q_rows,
                     const bf16* __restrict__ kv_rows, const float* __restrict__ lse,
                     const float* __restrict__ dot, Pieces at, float scale, bool add, bool vec) {
  constexpr int ldt = Smem<D>::kLdT;
  const BwdRegions<D> R(dynamic_smem());
  bf16 *k = R.own0, *v = R.own1, *q = R.str0, *dO = R.str1;
  const int warp = threadIdx.x / 32;
  const int bkv = blockIdx.x, b = bkv / at.NKV, kvh = bkv % at.NKV, group = at.NH / at.NKV;
  const int k0 = blockIdx.y * kTile;  // tile 0 meets the most queries: it goes first
  const int q_len = at.q.len, kv_len = at.kv.len;
  load_tile<D>(k, kv_rows + at.k_at(b, kvh), at.kv.ld, k0, kv_len, vec);
  load_tile<D>(v, kv_rows + at.v_at(b, kvh), at.kv.ld, k0, kv_len, vec);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const std::size_t bh = static_cast<std::size_t>(b) * at.NH + h;
    const bf16* queries = q_rows + at.q_at(b, h);
    const bf16* dbase = dout + at.out_at(b, h);
    for (int q0 = at.first_query_tile(k0); q0 < q_len; q0 += kTile) {
      __syncthreads();  // every warp is done with the previous q, dO, lse, dot
      load_tile<D>(q, queries, at.q.ld, q0, q_len, vec);
      load_tile<D>(dO, dbase, at.NH * D, q0, q_len, vec);
      load_rows(R.lse, lse + bh * q_len, q0, q_len);
      load_rows(R.dot, dot + bh * q_len, q0, q_len);
      __syncthreads();
      product_abt<D>(R.s, k + 16 * warp * ldt, q);    // S^T = K_w Q^T
      product_abt<D>(R.dp, v + 16 * warp * ldt, dO);  // dP^T = V_w dO^T
      __syncwarp();
      probs_and_grads<true>(R.p, R.ds, R.s, R.dp, R.lse, R.dot, k0 + 16 * warp, q0, at, scale);
      __syncwarp();
      product_pb<D>(dv, R.p, dO);  // dV_w += P^T dO
      product_pb<D>(dk, R.ds, q);  // dK_w += dS^T Q
    }
  }
  write_result<D>(dkv + at.k_at(b, kvh), at.kv.ld, k0 + 16 * warp, kv_len, dk, R.s, scale, add);
  write_result<D>(dkv + at.v_at(b, kvh), at.kv.ld, k0 + 16 * warp, kv_len, dv, R.s, 1.0f, add);
}

// The three launches: the row dots, dQ over the query rows q, dK and dV over the key
// rows kv; written or added (`add`).
void backward(bf16* dq, bf16* dkv, const bf16* dout, const bf16* out, const float* lse,
              void* workspace, const bf16* q_rows, FlashRows q, const bf16* kv_rows, FlashRows kv,
              int B, int NH, int NKV, int hs, bool add, cudaStream_t s) {
  const char* op = "flash_attention_backward";
  PPTRAIN_CHECK(B > 0 && q.len > 0 && kv.len > 0 && NH > 0 && NKV > 0,
                std::string(op) + ": non-positive size");
  PPTRAIN_CHECK(NH % NKV == 0, std::string(op) + ": NH must be a multiple of NKV");
  PPTRAIN_CHECK(dq && dkv && dout && out && lse && workspace && q_rows && kv_rows,
                std::string(op) + ": null pointer");
  const long long rows = static_cast<long long>(B) * q.len * NH;
  PPTRAIN_CHECK(rows < (1LL << 31) && q.len <= 65535 * kTile && kv.len <= 65535 * kTile,
                std::string(op) + ": too many rows");
  // D = rowsum(dO * O).
  auto* dot = static_cast<float*>(workspace);
  constexpr int kDotThreads = 256;
  const unsigned dot_blocks =
      static_cast<unsigned>((rows + kDotThreads / 32 - 1) / (kDotThreads / 32));
  row_dot_kernel<<<dot_blocks, kDotThreads, 0, s>>>(dot, dout, out, q.len, NH, hs,
                                                    static_cast<int>(rows));
  PPTRAIN_CUDA_CHECK_LAUNCH();

  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const dim3 q_grid(B * NH, (q.len + kTile - 1) / kTile), kv_grid(B * NKV, (kv.len + kTile - 1) / kTile);
  const bool vec = aligned16({q_rows, kv_rows, dout}) && q.ld % 8 == 0 && kv.ld % 8 == 0;
  const bool known = with_head_size(hs, [&](auto d) {
    constexpr int D = decltype(d)::value;
    constexpr std::size_t bytes = Smem<D>::bwd;
    const Pieces at{q, kv, NH, NKV, D};
    allow_smem(flash_dq_kernel<D>, bytes);
    flash_dq_kernel<D><<<q_grid, kThreads, bytes, s>>>(dq, dout, q_rows, kv_rows, lse, dot, at,
                                                       scale, add, vec);
    PPTRAIN_CUDA_CHECK_LAUNCH();
    allow_smem(flash_dkv_kernel<D>, bytes);
    flash_dkv_kernel<D><<<kv_grid, kThreads, bytes, s>>>(dkv, dout, q_rows, kv_rows, lse, dot,
                                                         at, scale, add, vec);
    PPTRAIN_CUDA_CHECK_LAUNCH();
  });
  PPTRAIN_CHECK(known, std::string(op) + ": unsupported head size");
}

}  // namespace

std::size_t flash_attention_backward_workspace_bytes(int B, int T, int NH) {
  return cuda_attention_scratch_bytes(true, true, false, DType::BF16, B, T, NH, 0);
}

void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, void* workspace, int B, int T, int NH, int NKV,
                              int hs, cudaStream_t s) {
  const FlashRows whole{(NH + 2 * NKV) * hs, 0, T, NH * hs, (NH + NKV) * hs};
  backward(dqkv, dqkv, dout, out, lse, workspace, qkv, whole, qkv, whole, B, NH, NKV, hs,
           /*add=*/false, s);
}

void flash_attention_backward_piece(bf16* dq, bf16* dkv, const bf16* dout, const bf16* out,
                                    const float* lse, void* workspace, const bf16* q_rows,
                                    FlashRows q, const bf16* kv_rows, FlashRows kv, int B, int NH,
                                    int NKV, int hs, cudaStream_t s) {
  backward(dq, dkv, dout, out, lse, workspace, q_rows, q, kv_rows, kv, B, NH, NKV, hs,
           /*add=*/true, s);
}

}  // namespace pptrain::ops::cuda
