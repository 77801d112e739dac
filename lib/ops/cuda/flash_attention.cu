// Fused causal attention, forward (flash-attention style). One block per (batch, query
// head) and tile of kTile queries, reading the keys and values of the head's key/value
// head; warp w owns 16 of its query rows. For each key tile at
// or left of the diagonal (tiles wholly above it are never visited):
//   S = Q_w K^T                      (tensor cores, fp32)
//   online softmax per row, fp32:    m' = max(m, max_j s_j), alpha = exp(m - m'),
//                                    p_j = exp(s_j - m'), l' = alpha l + sum_j p_j
//   O_w = alpha O_w + P V            (P rounded to bf16, O accumulated in fp32)
// with s_j = scale * S_j for keys j <= query (others masked out); at the end
// out = O_w / l and lse = m + log l. O_w lives in the warp's shared memory, where the
// per-row rescale is a plain loop; the products load and store it as fragments.
#include <cmath>

#include "ops/cuda/flash_attention.cuh"
#include "ops/cuda/flash_attention.hpp"

namespace pptrain::ops::cuda {

using namespace flash;

namespace {

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16* out, float* lse, const bf16* __restrict__ qkv, int T, int NH,
                         int NKV, float scale, bool vec) {
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

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest rows go first
  const int C = NH * D;
  const QkvLayout heads{NH, NKV, D, T};
  const std::size_t ld = heads.ld();
  const bf16* keys = qkv + heads.k(b, heads.kv_head(h));
  const bf16* values = qkv + heads.v(b, heads.kv_head(h));
  load_tile<D>(q, qkv + heads.q(b, h), ld, q0, T, vec);
  for (int e = lane; e < 16 * kLdO; e += 32) o[e] = 0.0f;

  // Lanes 2r and 2r+1 own row r of the warp's 16: columns 2j + half.
  const int r = lane / 2, half = lane % 2;
  const int row = q0 + 16 * warp + r;  // query position
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous k, v
    load_tile<D>(k, keys, ld, k0, T, vec);
    load_tile<D>(v, values, ld, k0, T, vec);
    __syncthreads();
    product_abt<D>(s, q + 16 * warp * L::kLdT, k);
    __syncwarp();
    float x[kTile / 2];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const int c = 2 * j + half, key = k0 + c;
      x[j] = key <= row && key < T ? s[r * kLdS + c] * scale : -INFINITY;
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
  // Key 0 is live for every row, so l >= 1 here.
  const float inv = 1.0f / l;
  for (int c = half; c < D; c += 2) o[r * kLdO + c] *= inv;
  if (lse != nullptr && half == 0 && row < T) lse[static_cast<std::size_t>(bh) * T + row] = m + logf(l);
  __syncwarp();
  store_rows<D>(out + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * D, C,
                q0 + 16 * warp, T, o, kLdO, 1.0f);
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
  PPTRAIN_CHECK(B > 0 && T > 0 && NH > 0 && NKV > 0, "flash_attention_forward: non-positive size");
  PPTRAIN_CHECK(NH % NKV == 0, "flash_attention_forward: NH must be a multiple of NKV");
  PPTRAIN_CHECK(out && qkv, "flash_attention_forward: null pointer");
  PPTRAIN_CHECK(T <= 65535 * kTile && static_cast<long long>(B) * NH < (1LL << 31),
                "flash_attention_forward: too many tiles");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const dim3 grid(B * NH, (T + kTile - 1) / kTile);
  const bool vec = aligned16({qkv});
  const bool known = with_head_size(hs, [&](auto d) {
    constexpr int D = decltype(d)::value;
    allow_smem(flash_forward_kernel<D>, Smem<D>::fwd);
    flash_forward_kernel<D>
        <<<grid, kThreads, Smem<D>::fwd, s>>>(out, lse, qkv, T, NH, NKV, scale, vec);
    PPTRAIN_CUDA_CHECK_LAUNCH();
  });
  PPTRAIN_CHECK(known, "flash_attention_forward: unsupported head size");
}

}  // namespace pptrain::ops::cuda
