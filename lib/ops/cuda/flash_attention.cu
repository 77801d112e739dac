// Fused causal attention, forward (FlashAttention-2's work split). One block per
// (batch, query head) and tile of kTile queries, reading the keys and values of the
// head's key/value head; warp w owns 16 of its query rows and keeps everything of them in
// registers: Q as mma.sync A fragments (loaded once), the scores S, the probabilities P
// and the output accumulator O (warp_mma.cuh's fragment layouts). For each key tile that
// a query of the tile sees (tiles wholly after them are never visited):
//   S = Q_w K^T                      (mma.sync, fp32)
//   online softmax per row, fp32:    m' = max(m, max_j s_j), alpha = 2^((m - m') c),
//                                    p_j = 2^((s_j - m') c), l' = alpha l + sum_j p_j
//   O_w = alpha O_w + P V            (P rounded to bf16, straight from S's registers)
// with c = scale * log2(e) and only the keys each query sees (the mask is applied only in
// tiles that reach past the diagonal or the keys' end); at the end out = O_w / l and
// lse = (m c + log2 l) / log2(e), or, for a ring step that merges, out and lse combined
// with what they hold, each side weighted by its share of the row's exp-sum. K and V
// tiles are double-buffered: cp.async fetches tile j+1 while tile j is used. A lane
// holds rows g = lane/4 and g+8 of its warp's 16, and partial sums l over its columns
// (the row's four lanes add them at the end). The whole sequence is one piece against
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
  constexpr int kElems = Smem<D>::kElems;
  bf16* q = dynamic_smem();  // then k twice, v twice
  bf16* k = q + kElems;
  bf16* v = q + 3 * kElems;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  const int bh = blockIdx.x, b = bh / at.NH, h = bh % at.NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest rows go first
  const int q_len = at.q.len, tiles = (at.keys_end(q0) + kTile - 1) / kTile;
  const bf16* keys = kv_rows + at.k_at(b, at.kv_head(h));
  const bf16* values = kv_rows + at.v_at(b, at.kv_head(h));
  fetch_tile<D>(q, q_rows + at.q_at(b, h), at.q.ld, q0, q_len, vec);
  if (tiles > 0) {
    fetch_tile<D>(k, keys, at.kv.ld, 0, at.kv.len, vec);
    fetch_tile<D>(v, values, at.kv.ld, 0, at.kv.len, vec);
  }
  ptx::cp_async_commit();

  const int row_g = q0 + 16 * warp + g;  // this lane's query rows: row_g and row_g + 8
  const float c = scale * kLog2e;        // scores to base-2 exponents
  std::uint32_t qf[D / 16][4];
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int j = 0; j < tiles; ++j) {
    const int k0 = j * kTile, buf = j % 2;
    land_current(j + 1 < tiles, [&] {
      fetch_tile<D>(k + (1 - buf) * kElems, keys, at.kv.ld, k0 + kTile, at.kv.len, vec);
      fetch_tile<D>(v + (1 - buf) * kElems, values, at.kv.ld, k0 + kTile, at.kv.len, vec);
    });
    __syncthreads();  // every thread's copies of tile j (and of q) have landed
    if (j == 0) load_a<D>(qf, q + 16 * warp * Smem<D>::kLd);
    float s[kBlocks][4] = {};
    product_abt<D>(s, qf, k + buf * kElems);  // S = Q_w K^T

    // Masked (only where the tile reaches past the diagonal or the keys' end) and scaled
    // to base 2; the row maxima over the row's four lanes.
    const bool edge = k0 + kTile > at.kv.len || !at.sees(q0 + 16 * warp, k0 + kTile - 1);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kBlocks; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2, key = k0 + 8 * n + 2 * t + e % 2;
        float x = s[n][e] * c;
        if (edge && !at.sees(row_g + 8 * half, key)) x = -INFINITY;
        s[n][e] = x;
        mx[half] = fmaxf(mx[half], x);
      }
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
      const float m_new = fmaxf(m[half], mx[half]);
      const float ref = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing live yet
      alpha[half] = exp2f(m[half] - ref);
      m[half] = m_new, mx[half] = ref;
      l[half] *= alpha[half];
    }
#pragma unroll
    for (int n = 0; n < kBlocks; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - mx[e / 2]);
        l[e / 2] += s[n][e];
      }
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[d][e] *= alpha[e / 2];
    product_pb<D>(o, s, v + buf * kElems);  // O += P V
    __syncthreads();  // every warp is done with buffer buf before it is refilled
  }

  // Per row (half 0: row_g, 1: row_g + 8): its sums over the four lanes; the weights of
  // what out held (keep) and of this pass (add); a row that saw no key keeps what it
  // held. Written, or merged by log-sum-exp with the rows so far (lse -inf: nothing yet).
  const int C = at.NH * D;
  bf16* dst = out + at.out_at(b, h);
  float keep[2], add[2], row_lse[2];
  bool live[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
    const int row = row_g + 8 * half;
    live[half] = l[half] > 0.0f && row < q_len;
    keep[half] = 0.0f, add[half] = 1.0f / l[half];
    if (!live[half]) continue;
    const float piece = (m[half] + log2f(l[half])) * 0.6931471805599453f;
    float* lse_at = lse + static_cast<std::size_t>(bh) * q_len + row;
    row_lse[half] = piece;
    if (!write) {
      const float before = *lse_at, top = fmaxf(before, piece);
      const float w_before = expf(before - top), w_piece = expf(piece - top);
      const float total = w_before + w_piece;
      keep[half] = w_before / total, add[half] = w_piece / (total * l[half]);
      row_lse[half] = top + logf(total);
    }
  }
  __syncwarp();  // every lane has read lse before one of the row's lanes writes it
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!live[half]) continue;
    const int row = row_g + 8 * half;
    if (t == 0) lse[static_cast<std::size_t>(bh) * q_len + row] = row_lse[half];
    bf16* d_row = dst + static_cast<std::size_t>(row) * C + 2 * t;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      float x0 = o[d][2 * half] * add[half], x1 = o[d][2 * half + 1] * add[half];
      if (!write) {
        x0 += __bfloat162float(d_row[8 * d]) * keep[half];
        x1 += __bfloat162float(d_row[8 * d + 1]) * keep[half];
      }
      d_row[8 * d] = __float2bfloat16_rn(x0);
      d_row[8 * d + 1] = __float2bfloat16_rn(x1);
    }
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
