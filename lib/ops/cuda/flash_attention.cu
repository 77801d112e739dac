// Fused causal attention, forward (flash-attention style). One block per (batch, query
// head) and tile of kTile queries, reading the keys and values of the head's key/value
// head; warp w owns 16 of its query rows. For each key tile that a query of the tile
// sees (tiles wholly after them are never visited):
//   S = Q_w K^T                      (tensor cores, fp32)
//   online softmax per row, fp32:    m' = max(m, max_j s_j), alpha = exp(m - m'),
//                                    p_j = exp(s_j - m'), l' = alpha l + sum_j p_j
//   O_w = alpha O_w + P V            (P rounded to bf16, O accumulated in fp32)
// with s_j = scale * S_j for the keys the query sees (others masked out); at the end
// out = O_w / l and lse = m + log l, or, for a ring step that merges, out and lse
// combined with what they hold, each side weighted by its share of the row's exp-sum.
// O_w lives in the warp's shared memory, where the per-row rescale is a plain loop; the
// products load and store it as fragments. The whole sequence is one piece against
// itself.
#include <cmath>
#include <string>

#include "ops/cuda/flash_attention.cuh"
#include "ops/cuda/flash_attention.hpp"

namespace pptrain::ops::cuda {

using namespace flash;

namespace {

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16* out, float* lse, const bf16* __restrict__ q_rows,
                         const bf16* __restrict__ kv_rows, Pieces at, float scale, bool write,
                         bool vec) {
  using L = Smem<D>;
  constexpr int kLdO = L::kLdO;
  unsigned char* smem = dynamic_smem();
  bf16* q = reinterpret_cast<bf16*>(smem);
  bf16* k = reinterpret_cast<bf16*>(smem + L::tile);
  bf16* v = reinterpret_cast<bf16*>(smem + 2 * L::tile);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine = smem + 3 * L::tile + warp * L::fwd_warp;
  float* s = reinterpret_cast<float*>(mine);
  float* o = reinterpret_cast<float*>(mine + L::scores);
  bf16* p = reinterpret_cast<bf16*>(mine + L::scores + L::result);

  const int bh = blockIdx.x, b = bh / at.NH, h = bh % at.NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest rows go first
  const int C = at.NH * D, q_len = at.q.len;
  const bf16* keys = kv_rows + at.k_at(b, at.kv_head(h));
  const bf16* values = kv_rows + at.v_at(b, at.kv_head(h));
  load_tile<D>(q, q_rows + at.q_at(b, h), at.q.ld, q0, q_len, vec);
  for (int e = lane; e < 16 * kLdO; e += 32) o[e] = 0.0f;

  // Lanes 2r and 2r+1 own row r of the warp's 16: columns 2j + half.
  const int r = lane / 2, half = lane % 2;
  const int row = q0 + 16 * warp + r;  // query index
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 < at.keys_end(q0); k0 += kTile) {
    __syncthreads();  // every warp is done with the previous k, v
    load_tile<D>(k, keys, at.kv.ld, k0, at.kv.len, vec);
    load_tile<D>(v, values, at.kv.ld, k0, at.kv.len, vec);
    __syncthreads();
    product_abt<D>(s, q + 16 * warp * L::kLdT, k);
    __syncwarp();
    float x[kTile / 2];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const int c = 2 * j + half;
      x[j] = at.sees(row, k0 + c) ? s[r * kLdS + c] * scale : -INFINITY;
      mx = fmaxf(mx, x[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float ref = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing live yet
    const float alpha = expf(m - ref);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const float e = expf(x[j] - ref);
      sum += e;
      p[r * kLdP + 2 * j + half] = __float2bfloat16_rn(e);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = alpha * l + sum;
    m = m_new;
    for (int c = half; c < D; c += 2) o[r * kLdO + c] *= alpha;
    __syncwarp();
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::load_matrix_sync(acc[n], o + 16 * n, kLdO, wmma::mem_row_major);
    product_pb<D>(acc, p, v);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::store_matrix_sync(o + 16 * n, acc[n], kLdO, wmma::mem_row_major);
    __syncwarp();
  }
  // Row r's weights, in the scores (free now): what it held (keep) and this pass's sums
  // (add); -1 marks a row that saw no key and keeps what it held. Written, or merged by
  // log-sum-exp with the rows so far (lse -inf: nothing yet).
  float* keep = s;
  float* add = s + 16;
  if (half == 0) {
    const bool live = l > 0.0f && row < q_len;
    float* row_lse = lse + static_cast<std::size_t>(bh) * q_len + row;
    float w_keep = 0.0f, w_add = live ? 1.0f / l : -1.0f;
    if (live) {
      const float piece = m + logf(l);
      if (write) {
        *row_lse = piece;
      } else {
        const float before = *row_lse, top = fmaxf(before, piece);
        const float w_before = expf(before - top), w_piece = expf(piece - top);
        const float total = w_before + w_piece;
        w_keep = w_before / total, w_add = w_piece / (total * l);
        *row_lse = top + logf(total);
      }
    }
    keep[r] = w_keep, add[r] = w_add;
  }
  __syncwarp();
  bf16* dst = out + at.out_at(b, h);
  for (int e = lane; e < 16 * D; e += 32) {
    const int i = e / D, c = e % D, query = q0 + 16 * warp + i;
    if (query >= q_len || add[i] < 0.0f) continue;
    bf16& d = dst[static_cast<std::size_t>(query) * C + c];
    const float x = o[i * kLdO + c] * add[i];
    d = __float2bfloat16_rn(write ? x : __bfloat162float(d) * keep[i] + x);
  }
}

// The launch over the query rows q against the key rows kv.
void forward(bf16* out, float* lse, const bf16* q_rows, FlashRows q, const bf16* kv_rows,
             FlashRows kv, int B, int NH, int NKV, int hs, bool write, cudaStream_t s) {
  const char* op = "flash_attention_forward";
  PPTRAIN_CHECK(B > 0 && q.len > 0 && kv.len > 0 && NH > 0 && NKV > 0,
                std::string(op) + ": non-positive size");
  PPTRAIN_CHECK(NH % NKV == 0, std::string(op) + ": NH must be a multiple of NKV");
  PPTRAIN_CHECK(out && lse && q_rows && kv_rows, std::string(op) + ": null pointer");
  PPTRAIN_CHECK(q.len <= 65535 * kTile && static_cast<long long>(B) * NH < (1LL << 31),
                std::string(op) + ": too many tiles");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const dim3 grid(B * NH, (q.len + kTile - 1) / kTile);
  const bool vec = aligned16({q_rows, kv_rows}) && q.ld % 8 == 0 && kv.ld % 8 == 0;
  const bool known = with_head_size(hs, [&](auto d) {
    constexpr int D = decltype(d)::value;
    allow_smem(flash_forward_kernel<D>, Smem<D>::fwd);
    flash_forward_kernel<D><<<grid, kThreads, Smem<D>::fwd, s>>>(
        out, lse, q_rows, kv_rows, Pieces{q, kv, NH, NKV, D}, scale, write, vec);
    PPTRAIN_CUDA_CHECK_LAUNCH();
  });
  PPTRAIN_CHECK(known, std::string(op) + ": unsupported head size");
}

}  // namespace

bool flash_attention_supported(int hs, int max_smem) {
  bool fits = false;
  const bool known = flash::with_head_size(hs, [&](auto d) {
    using L = flash::Smem<decltype(d)::value>;
    fits = std::max(L::fwd, L::bwd) <= static_cast<std::size_t>(max_smem);
  });
  return known && fits;
}

void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV,
                             int hs, cudaStream_t s) {
  const FlashRows whole{(NH + 2 * NKV) * hs, 0, T, NH * hs, (NH + NKV) * hs};
  forward(out, lse, qkv, whole, qkv, whole, B, NH, NKV, hs, /*write=*/true, s);
}

void flash_attention_forward_piece(bf16* out, float* lse, const bf16* q_rows, FlashRows q,
                                   const bf16* kv_rows, FlashRows kv, int B, int NH, int NKV,
                                   int hs, bool write, cudaStream_t s) {
  forward(out, lse, q_rows, q, kv_rows, kv, B, NH, NKV, hs, write, s);
}

}  // namespace pptrain::ops::cuda
