// Launchers of the fused (flash-attention-style) causal self-attention, bf16 only:
// tensor-core tiles, an online softmax in fp32, no [T,T] array in memory. q, k and v
// are read in place from qkv[B,T,W] (rows of NH query heads, then NKV key and NKV value
// heads, of hs each: W = (NH + 2*NKV) * hs; query head h uses key/value head
// h / (NH/NKV)) and the result written to out[B,T,NH*hs]; the only saved state is the
// logsumexp of each query row's scaled scores, lse[B,NH,T] (fp32). The backward reads
// the forward's out too and recomputes the probabilities from lse (see
// flash_attention_backward.cu). The same kernels run context parallelism's ring steps on
// pieces of the sequence (ops::Ops::ring_attention_forward_step and its backward).
// Kernels in flash_attention.cu and flash_attention_backward.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace pptrain::ops::cuda {

// Rows of B sequences, `len` rows each and `ld` elements apart, holding positions
// [first, first + len) of the whole sequence. Query head h's hs columns start at h * hs,
// key/value head g's at k_col + g * hs and v_col + g * hs. A query sees the keys at or
// before its position.
struct FlashRows {
  int ld, first, len, k_col, v_col;
};

// True when the fused kernels handle head size hs (a multiple of 16 up to 128) on a device
// whose blocks may opt into max_smem bytes of shared memory
// (cudaDevAttrMaxSharedMemoryPerBlockOptin). One answer for forward and backward.
bool flash_attention_supported(int hs, int max_smem);

// out[b,t,h,:] = sum_{s<=t} softmax_s(q_t . k_s / sqrt(hs)) v_s per query head h (k, v
// of its key/value head); lse[(b*NH+h)*T+t] = log sum_{s<=t} exp(q_t . k_s / sqrt(hs)).
void flash_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B,
                             int T, int NH, int NKV, int hs, cudaStream_t s);

// Bytes of device scratch flash_attention_backward needs.
std::size_t flash_attention_backward_workspace_bytes(int B, int T, int NH);

// dqkv[B,T,W] = gradient w.r.t. qkv (all of it overwritten; a key/value head's is the
// sum over its query heads) from dout[B,T,NH*hs], qkv and the forward's out[B,T,NH*hs]
// and lse (both as flash_attention_forward wrote them); `workspace` holds the bytes
// asked for above. Deterministic (no atomics).
void flash_attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                              const float* lse, void* workspace, int B, int T, int NH, int NKV,
                              int hs, cudaStream_t s);

// Ring attention's steps (ops.hpp's contract): the queries of the rows q (q|k|v rows)
// against the keys and values of kv (rows at kv_rows; the ring's k|v rows, k_col 0 and
// v_col NKV * hs). Forward: into out [B, q.len, NH*hs] and lse [B, NH, q.len], written
// (`write`) or merged by log-sum-exp with what they hold; rows that see no key keep it.
// Backward, from the final out and lse: adds to the q columns of dq (q's layout) and to
// dkv (kv's layout); `workspace` holds flash_attention_backward_workspace_bytes(B,
// q.len, NH). hs: a head size flash_attention_supported takes.
void flash_attention_forward_piece(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q_rows,
                                   FlashRows q, const __nv_bfloat16* kv_rows, FlashRows kv, int B,
                                   int NH, int NKV, int hs, bool write, cudaStream_t s);
void flash_attention_backward_piece(__nv_bfloat16* dq, __nv_bfloat16* dkv,
                                    const __nv_bfloat16* dout, const __nv_bfloat16* out,
                                    const float* lse, void* workspace,
                                    const __nv_bfloat16* q_rows, FlashRows q,
                                    const __nv_bfloat16* kv_rows, FlashRows kv, int B, int NH,
                                    int NKV, int hs, cudaStream_t s);

}  // namespace pptrain::ops::cuda
