// CUDA backend: causal self-attention with grouped key/value heads. Two implementations:
//
// Unfused (fp32, or train.attention: unfused): heads are split into [B*NH, T, hs]
// arrays (k and v repeated for each query head of a key/value head's group, their
// gradients summed back over it), the two products per direction are strided batched
// cuBLASLt GEMMs over the B*NH heads, and the causal softmax is a kernel. The saved
// state is the [B*NH, T, T] softmax probabilities in the compute dtype. The scale
// 1/sqrt(hs) is applied once, inside the softmax (forward) and its backward (which
// returns d(raw scores)).
//
// Fused (flash_attention on and bf16 compute): the kernels of flash_attention.hpp,
// reading qkv and writing out in place; the state is the rows' logsumexp, fp32
// [B, NH, T], and the backward also reads the forward's out. Head sizes they do not
// handle (other than the multiples of 16 up to 128, or a device without the shared
// memory they need) take the unfused path with the probabilities in workspace, recomputed by the
// backward, since the state is sized for the fused kernels (attention_state_bytes does
// not see the head size). The choice depends only on the head size and the device, so
// forward and backward always agree.
#include <cmath>

#include "core/error.hpp"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/flash_attention.hpp"

namespace pptrain::ops {

using cuda::typed;

namespace {

void check_shape(int B, int T, int C, int NH, int NKV) {
  PPTRAIN_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && NKV > 0, "attention: non-positive size");
  PPTRAIN_CHECK(C % NH == 0, "attention: C must be a multiple of NH");
  PPTRAIN_CHECK(NH % NKV == 0, "attention: NH must be a multiple of NKV");
}

// A product batched over the B*NH heads: C[M,N] = op(A) op(B) per head, dense
// per-head matrices one after the other.
cuda::GemmProblem head_product(bool trans_a, bool trans_b, int M, int N, int K, int heads,
                               DType t) {
  cuda::GemmProblem p;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.M = M, p.N = N, p.K = K;
  p.batch = heads;
  p.stride_a = int64_t(M) * K;
  p.stride_b = int64_t(K) * N;
  p.stride_c = int64_t(M) * N;
  p.ab = p.cd = t;
  return p;
}

}  // namespace

std::size_t CudaOps::attention_state_bytes(int B, int T, int NH) const {
  return ops::attention_state_bytes(flash_active(), dtype_, B, T, NH);
}

void CudaOps::attention_probs(Act* att, Act* q, Act* k, Act* v, const Act* qkv, int B, int T,
                              int NH, int NKV, int hs) {
  const float scale = 1.0f / std::sqrt(float(hs));
  launch_typed([](auto... args) { cuda::split_heads(args...); }, q, k, v, qkv, B, T, NH, NKV, hs);
  // att = q @ k^T (raw scores), then in place softmax(scale * scores) with causal mask.
  gemm_.run(head_product(false, true, T, T, hs, B * NH, dtype_), 1.0f, {q, k, att}, 0.0f,
            stream());
  launch_typed([](auto... args) { cuda::causal_softmax_forward(args...); }, att, scale, B * NH, T);
}

void CudaOps::attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C,
                                int NH, int NKV) {
  check_shape(B, T, C, NH, NKV);
  const int hs = C / NH;
  if (flash_active() && cuda::flash_attention_supported(hs, max_smem_optin_)) {
    cuda::flash_attention_forward(typed<cuda::bf16>(out), static_cast<float*>(state),
                                  typed<cuda::bf16>(qkv), B, T, NH, NKV, hs, stream());
    return;
  }
  // Unfused; with flash on (the fallback) the probabilities go to workspace, not state.
  const bool recompute = flash_active();
  const int BH = B * NH;
  const std::size_t n = std::size_t(B) * T * C;  // elements of each of q, k, v, y (NH heads)
  auto* ws = static_cast<Act*>(
      workspace(cuda_attention_scratch_bytes(false, false, recompute, dtype_, B, T, NH, hs)));
  Act* q = ws;
  Act* k = advance(q, n, dtype_);
  Act* v = advance(k, n, dtype_);
  Act* y = advance(v, n, dtype_);
  Act* att = recompute ? advance(y, n, dtype_) : static_cast<Act*>(state);
  attention_probs(att, q, k, v, qkv, B, T, NH, NKV, hs);
  // y = att @ v, then heads back to [B,T,C].
  gemm_.run(head_product(false, false, T, hs, T, BH, dtype_), 1.0f, {att, v, y}, 0.0f, stream());
  launch_typed([](auto... args) { cuda::merge_heads(args...); }, out, y, B, T, NH, hs);
}

// The unfused path does not need `out`.
void CudaOps::attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                                 const void* state, int B, int T, int C, int NH, int NKV) {
  check_shape(B, T, C, NH, NKV);
  const int hs = C / NH;
  if (flash_active() && cuda::flash_attention_supported(hs, max_smem_optin_)) {
    void* ws = workspace(cuda_attention_scratch_bytes(true, true, false, dtype_, B, T, NH, hs));
    cuda::flash_attention_backward(typed<cuda::bf16>(dqkv), typed<cuda::bf16>(dout),
                                   typed<cuda::bf16>(qkv), typed<cuda::bf16>(out),
                                   static_cast<const float*>(state), ws, B, T, NH, NKV, hs,
                                   stream());
    return;
  }
  const bool recompute = flash_active();  // the fallback: probabilities not in state
  const std::size_t n = std::size_t(B) * T * C;
  const std::size_t tt = std::size_t(B) * NH * T * T;
  // q, k, v, then dy, dq, dk, dv ([BH,T,hs] each) and datt [BH,T,T]; then the
  // recomputed probabilities [BH,T,T].
  auto* ws = static_cast<Act*>(
      workspace(cuda_attention_scratch_bytes(true, false, recompute, dtype_, B, T, NH, hs)));
  Act* q = ws;
  Act* k = advance(q, n, dtype_);
  Act* v = advance(k, n, dtype_);
  Act* rest = advance(v, n, dtype_);
  if (recompute) {
    Act* att = advance(rest, 4 * n + tt, dtype_);
    attention_probs(att, q, k, v, qkv, B, T, NH, NKV, hs);
    attention_unfused_backward(dqkv, dout, att, q, k, v, rest, B, T, NH, NKV, hs);
    return;
  }
  launch_typed([](auto... args) { cuda::split_heads(args...); }, q, k, v, qkv, B, T, NH, NKV, hs);
  attention_unfused_backward(dqkv, dout, static_cast<const Act*>(state), q, k, v, rest, B, T, NH,
                             NKV, hs);
}

// From the probabilities att and the split heads q, k, v; ws holds dy, dq, dk, dv
// ([BH,T,hs] each: dk and dv per query head, summed by merge_qkv_grad) and datt [BH,T,T].
void CudaOps::attention_unfused_backward(Act* dqkv, const Act* dout, const Act* att, Act* q,
                                         Act* k, Act* v, Act* ws, int B, int T, int NH, int NKV,
                                         int hs) {
  const int BH = B * NH;
  const std::size_t n = std::size_t(B) * T * NH * hs;
  const float scale = 1.0f / std::sqrt(float(hs));
  Act* dy = ws;
  Act* dq = advance(dy, n, dtype_);
  Act* dk = advance(dq, n, dtype_);
  Act* dv = advance(dk, n, dtype_);
  Act* datt = advance(dv, n, dtype_);
  launch_typed([](auto... args) { cuda::split_heads_grad(args...); }, dy, dout, B, T, NH, hs);
  // dv = att^T @ dy; datt = dy @ v^T.
  gemm_.run(head_product(true, false, T, hs, T, BH, dtype_), 1.0f, {att, dy, dv}, 0.0f, stream());
  gemm_.run(head_product(false, true, T, T, hs, BH, dtype_), 1.0f, {dy, v, datt}, 0.0f, stream());
  // datt becomes d(raw scores) = scale * p * (datt - sum_j p_j datt_j), 0 above the diagonal.
  launch_typed([](auto... args) { cuda::causal_softmax_backward(args...); }, datt, att, scale, BH,
               T);
  // dq = dscores @ k; dk = dscores^T @ q.
  gemm_.run(head_product(false, false, T, hs, T, BH, dtype_), 1.0f, {datt, k, dq}, 0.0f, stream());
  gemm_.run(head_product(true, false, T, hs, T, BH, dtype_), 1.0f, {datt, q, dk}, 0.0f, stream());
  launch_typed([](auto... args) { cuda::merge_qkv_grad(args...); }, dqkv, dq, dk, dv, B, T, NH,
               NKV, hs);
}

// Ring steps: with the fused kernels on (and a head size they take) the flash kernels on
// the pieces, else ring_attention.cu's loops.
bool CudaOps::flash_ring(int hs) const {
  return flash_active() && cuda::flash_attention_supported(hs, max_smem_optin_);
}

namespace {
cuda::FlashRows query_rows(const Ops::SeqPiece& q, int C, int NH, int NKV) {
  const int hs = C / NH;
  return {C + 2 * NKV * hs, q.first, q.len, 0, 0};
}
cuda::FlashRows key_rows(const Ops::SeqPiece& kv, int C, int NH, int NKV) {
  const int hs = C / NH;
  return {2 * NKV * hs, kv.first, kv.len, 0, NKV * hs};
}
}  // namespace

void CudaOps::ring_attention_forward_step(Act* out, void* state, SeqPiece q, SeqPiece kv, int B,
                                          int C, int NH, int NKV, bool write) {
  if (flash_ring(C / NH)) {
    cuda::flash_attention_forward_piece(
        typed<cuda::bf16>(out), static_cast<float*>(state), typed<cuda::bf16>(q.rows),
        query_rows(q, C, NH, NKV), typed<cuda::bf16>(kv.rows), key_rows(kv, C, NH, NKV), B, NH,
        NKV, C / NH, write, stream());
    return;
  }
  launch_typed([](auto... args) { cuda::ring_attention_forward_step(args...); }, out,
               static_cast<float*>(state), q.rows, q.first, q.len, kv.rows, kv.first, kv.len, B,
               NH, NKV, C / NH, write);
}

void CudaOps::ring_attention_backward_step(Act* dq, Act* dkv, const Act* dout, const Act* out,
                                           const void* state, SeqPiece q, SeqPiece kv, int B,
                                           int C, int NH, int NKV) {
  if (flash_ring(C / NH)) {
    void* ws = workspace(cuda::flash_attention_backward_workspace_bytes(B, q.len, NH));
    cuda::flash_attention_backward_piece(
        typed<cuda::bf16>(dq), typed<cuda::bf16>(dkv), typed<cuda::bf16>(dout),
        typed<cuda::bf16>(out), static_cast<const float*>(state), ws, typed<cuda::bf16>(q.rows),
        query_rows(q, C, NH, NKV), typed<cuda::bf16>(kv.rows), key_rows(kv, C, NH, NKV), B, NH,
        NKV, C / NH, stream());
    return;
  }
  launch_typed([](auto... args) { cuda::ring_attention_backward_step(args...); }, dq, dkv, dout,
               out, static_cast<const float*>(state), q.rows, q.first, q.len, kv.rows, kv.first,
               kv.len, B, NH, NKV, C / NH);
}

}  // namespace pptrain::ops
