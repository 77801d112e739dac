// Fused causal attention, backward (FlashAttention-2's products, deterministic: no
// atomics). With P_ij = exp(scale q_i.k_j - lse_i) for j <= i (the forward's
// probabilities, rebuilt from the saved lse), dP_ij = dO_i.v_j and
// D_i = dO_i.O_i = sum_j P_ij dP_ij:
//   dS = P * (dP - D)        (gradient of the scaled scores)
//   dV_j = sum_i P_ij dO_i,  dK_j = scale sum_i dS_ij q_i,  dQ_i = scale sum_j dS_ij k_j.
// O is the forward's output, passed in; a warp per query row computes D from it (into
// workspace). Two kernels follow, each owning what it writes, so that nothing is summed
// by atomics in an order that changes from run to run: one over the key tiles of each
// key/value head (dK, dV accumulated in registers over the query heads of its group, in
// order, and their query tiles at or below the diagonal: S^T, dP^T, P^T dO, dS^T Q) and
// one over the query tiles of each query head (dQ over the key tiles at or left of it:
// S, dP, dS K). That is 7 products where FlashAttention-2's single kernel, which adds dQ
// with atomics, has 5: S and dP are computed twice, 40% more tensor work in the backward.
// Everything of a warp's 16 rows stays in registers (flash_attention.cuh's products): P
// and dS go to the second products straight from the accumulators, rounded to bf16. A
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

// In place: s (scores) becomes P and dp (dO.v) becomes dS, for the warp's [16][kTile]
// accumulators; 0 where the query does not see the key (checked only on an `edge`
// tile). kKeyRows: rows are keys and columns queries (the dK/dV kernel), else the other
// way round. lse2 (base 2) and dot are of the queries from the first row (the first
// column, kKeyRows) on, in shared memory.
template <bool kKeyRows>
__device__ void probs_and_grads(float (&s)[kBlocks][4], float (&dp)[kBlocks][4],
                                const float* lse2, const float* dot, int row0, int col0,
                                bool edge, const Pieces& at, float c) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kBlocks; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e / 2), col = 8 * n + 2 * t + e % 2, qi = kKeyRows ? col : r;
      const bool seen =
          !edge || (kKeyRows ? at.sees(col0 + col, row0 + r) : at.sees(row0 + r, col0 + col));
      const float p = seen ? exp2f(s[n][e] * c - lse2[qi]) : 0.0f;
      s[n][e] = p;
      dp[n][e] = p * (dp[n][e] - dot[qi]);
    }
}

// lse2[r] = log2(e) lse[r] and d[r] = dot[r] for the kTile queries from q0 (rows past
// q_len: 0, masked anyway); lse and dot point at the head's rows.
__device__ inline void stage_rows(float* lse2, float* d, const float* lse, const float* dot,
                                  int q0, int q_len) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    const bool inside = q0 + r < q_len;
    lse2[r] = inside ? lse[q0 + r] * kLog2e : 0.0f;
    d[r] = inside ? dot[q0 + r] : 0.0f;
  }
}

// dQ for one query tile (warp: 16 queries) over the key tiles its queries see.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(bf16* dq, const bf16* __restrict__ dout, const bf16* __restrict__ q_rows,
                    const bf16* __restrict__ kv_rows, const float* __restrict__ lse,
                    const float* __restrict__ dot, Pieces at, float scale, bool add, bool vec) {
  constexpr int kElems = Smem<D>::kElems;
  bf16* q = dynamic_smem();  // then dO, k twice, v twice
  bf16* dO = q + kElems;
  bf16* k = q + 2 * kElems;
  bf16* v = q + 4 * kElems;
  float* lse2 = reinterpret_cast<float*>(q + 6 * kElems);  // then D
  const int warp = threadIdx.x / 32;
  const int bh = blockIdx.x, b = bh / at.NH, h = bh % at.NH, q_len = at.q.len;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest rows go first
  const int row0 = q0 + 16 * warp, tiles = (at.keys_end(q0) + kTile - 1) / kTile;
  const bf16* keys = kv_rows + at.k_at(b, at.kv_head(h));
  const bf16* values = kv_rows + at.v_at(b, at.kv_head(h));
  fetch_tile<D>(q, q_rows + at.q_at(b, h), at.q.ld, q0, q_len, vec);
  fetch_tile<D>(dO, dout + at.out_at(b, h), at.NH * D, q0, q_len, vec);
  if (tiles > 0) {
    fetch_tile<D>(k, keys, at.kv.ld, 0, at.kv.len, vec);
    fetch_tile<D>(v, values, at.kv.ld, 0, at.kv.len, vec);
  }
  ptx::cp_async_commit();
  const std::size_t head_rows = static_cast<std::size_t>(bh) * q_len;
  stage_rows(lse2, lse2 + kTile, lse + head_rows, dot + head_rows, q0, q_len);
  const float c = scale * kLog2e;
  float acc[D / 8][4] = {};
  for (int j = 0; j < tiles; ++j) {
    const int k0 = j * kTile, buf = j % 2;
    land_current(j + 1 < tiles, [&] {
      fetch_tile<D>(k + (1 - buf) * kElems, keys, at.kv.ld, k0 + kTile, at.kv.len, vec);
      fetch_tile<D>(v + (1 - buf) * kElems, values, at.kv.ld, k0 + kTile, at.kv.len, vec);
    });
    __syncthreads();  // tile j (and q, dO) landed for every thread
    const bf16* kt = k + buf * kElems;
    float s[kBlocks][4] = {}, dp[kBlocks][4] = {};
    {
      std::uint32_t af[D / 16][4];
      load_a<D>(af, q + 16 * warp * Smem<D>::kLd);
      product_abt<D>(s, af, kt);  // S = Q_w K^T
      load_a<D>(af, dO + 16 * warp * Smem<D>::kLd);
      product_abt<D>(dp, af, v + buf * kElems);  // dP = dO_w V^T
    }
    const bool edge = !(at.sees(row0, k0 + kTile - 1) && at.sees(row0 + 15, k0 + kTile - 1));
    probs_and_grads<false>(s, dp, lse2 + 16 * warp, lse2 + kTile + 16 * warp, row0, k0, edge, at,
                           c);
    product_pb<D>(acc, dp, kt);  // dQ_w += dS K
    __syncthreads();  // every warp is done with buffer buf before it is refilled
  }
  store_rows<D>(dq + at.q_at(b, h), at.q.ld, row0, q_len, acc, scale, add);
}

// dK, dV for one key tile (warp: 16 keys) of one key/value head, over the query heads of
// its group in order and, for each, the query tiles that see the key tile.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_dkv_kernel(bf16* dkv, const bf16* __restrict__ dout, const bf16* __restrict__ q_rows,
                     const bf16* __restrict__ kv_rows, const float* __restrict__ lse,
                     const float* __restrict__ dot, Pieces at, float scale, bool add, bool vec) {
  constexpr int kElems = Smem<D>::kElems;
  bf16* k = dynamic_smem();  // then v, q twice, dO twice
  bf16* v = k + kElems;
  bf16* q = k + 2 * kElems;
  bf16* dO = k + 4 * kElems;
  float* rows = reinterpret_cast<float*>(k + 6 * kElems);  // lse2, D; twice
  const int warp = threadIdx.x / 32;
  const int bkv = blockIdx.x, b = bkv / at.NKV, kvh = bkv % at.NKV, group = at.NH / at.NKV;
  const int k0 = blockIdx.y * kTile;  // tile 0 meets the most queries: it goes first
  const int q_len = at.q.len, kv_len = at.kv.len, row0 = k0 + 16 * warp;
  // The (query head, query tile) steps, in order: the heads of the group, and for each
  // the query tiles from the first that sees the key tile.
  const int first = at.first_query_tile(k0);
  const int per_head = first < q_len ? (q_len - first + kTile - 1) / kTile : 0;
  const int steps = group * per_head;
  auto fetch_step = [&](int i, int buf) {
    const int h = kvh * group + i / per_head, q0 = first + i % per_head * kTile;
    fetch_tile<D>(q + buf * kElems, q_rows + at.q_at(b, h), at.q.ld, q0, q_len, vec);
    fetch_tile<D>(dO + buf * kElems, dout + at.out_at(b, h), at.NH * D, q0, q_len, vec);
  };
  fetch_tile<D>(k, kv_rows + at.k_at(b, kvh), at.kv.ld, k0, kv_len, vec);
  fetch_tile<D>(v, kv_rows + at.v_at(b, kvh), at.kv.ld, k0, kv_len, vec);
  if (steps > 0) fetch_step(0, 0);
  ptx::cp_async_commit();
  const float c = scale * kLog2e;
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int i = 0; i < steps; ++i) {
    const int buf = i % 2, h = kvh * group + i / per_head, q0 = first + i % per_head * kTile;
    const std::size_t head_rows = (static_cast<std::size_t>(b) * at.NH + h) * q_len;
    float* lse2 = rows + buf * 2 * kTile;  // its last readers passed two barriers since
    stage_rows(lse2, lse2 + kTile, lse + head_rows, dot + head_rows, q0, q_len);
    land_current(i + 1 < steps, [&] { fetch_step(i + 1, 1 - buf); });
    __syncthreads();  // step i's q and dO (and k, v) landed for every thread
    const bf16* qt = q + buf * kElems;
    const bf16* dOt = dO + buf * kElems;
    float st[kBlocks][4] = {}, dpt[kBlocks][4] = {};
    {
      std::uint32_t af[D / 16][4];
      load_a<D>(af, k + 16 * warp * Smem<D>::kLd);
      product_abt<D>(st, af, qt);  // S^T = K_w Q^T
      load_a<D>(af, v + 16 * warp * Smem<D>::kLd);
      product_abt<D>(dpt, af, dOt);  // dP^T = V_w dO^T
    }
    const bool edge = !(at.sees(q0, row0 + 15) && at.sees(q0 + kTile - 1, row0 + 15));
    probs_and_grads<true>(st, dpt, lse2, lse2 + kTile, row0, q0, edge, at, c);
    product_pb<D>(dv, st, dOt);  // dV_w += P^T dO
    product_pb<D>(dk, dpt, qt);  // dK_w += dS^T Q
    __syncthreads();  // every warp is done with buffer buf before it is refilled
  }
  store_rows<D>(dkv + at.k_at(b, kvh), at.kv.ld, row0, kv_len, dk, scale, add);
  store_rows<D>(dkv + at.v_at(b, kvh), at.kv.ld, row0, kv_len, dv, 1.0f, add);
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
