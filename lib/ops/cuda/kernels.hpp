// Launchers of the CUDA backend's own kernels: one function per op, each taking its
// stream, checking its preconditions and the launch. T is the element type of
// activations and weight copies (float or __nv_bfloat16); statistics, losses,
// parameter gradients, master weights and optimizer state are always float. Inside
// the kernels all arithmetic is fp32. Each launcher's contract is the one of the
// ops::Ops method of the same name (ops/ops.hpp); the kernels are static in the .cu
// files that define these launchers (explicitly instantiated for both T).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pptrain::ops::cuda {

using bf16 = __nv_bfloat16;

// ---- elementwise (elementwise.cu) ----
template <typename T> void add(T* out, const T* a, const T* b, std::size_t n, cudaStream_t s);
template <typename T> void add_bias(T* out, const T* bias, int N, int C, cudaStream_t s);
// ops::Ops::copy_columns.
template <typename T>
void copy_columns(T* dst, int dst_width, int dst_col, const T* src, int src_width, int src_col,
                  int rows, int cols, cudaStream_t s);
// dbias[c] += sum_n dout[n,c] (deterministic: fixed reduction order, no atomics).
// `scratch` holds at least bias_backward_scratch_floats(N, C) floats of device memory.
template <typename T>
void bias_backward(float* dbias, const T* dout, int N, int C, float* scratch, cudaStream_t s);
std::size_t bias_backward_scratch_floats(int N, int C);
// out[c] += sum over k < chunks of part[k * C + c], in order (the second pass of the
// column sums; with one chunk, a bias gradient a product wrote apart added to out).
void add_column_sums(float* out, const float* part, int chunks, int C, cudaStream_t s);
template <typename T> void gelu_forward(T* out, const T* inp, std::size_t n, cudaStream_t s);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n, cudaStream_t s);
// dst = T(src) and dst = float(src).
template <typename T> void to_compute(T* dst, const float* src, std::size_t n, cudaStream_t s);
template <typename T> void to_float(float* dst, const T* src, std::size_t n, cudaStream_t s);

// ---- LayerNorm (layernorm.cu), eps = 1e-5 ----
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                       int N, int C, cudaStream_t s);
template <typename T>
void layernorm_backward_input(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                              const float* mean, const float* rstd, int N, int C, cudaStream_t s);
// Deterministic column sums (no atomics). `scratch` holds at least
// layernorm_backward_weight_scratch_floats(N, C) floats of device memory.
template <typename T>
void layernorm_backward_weight(float* dw, float* db, const T* dout, const T* inp,
                               const float* mean, const float* rstd, int N, int C, float* scratch,
                               cudaStream_t s);
std::size_t layernorm_backward_weight_scratch_floats(int N, int C);
// Both, bit-identical to layernorm_backward_input then layernorm_backward_weight, in one
// pass over the rows: layernorm_backward_weight_scratch_floats(N, C) floats of scratch and
// layernorm_backward_shared_bytes(C) of shared memory a block, at most max_shared (the
// device's opt-in limit).
template <typename T>
void layernorm_backward(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                        const float* mean, const float* rstd, float* dw, float* db, int N, int C,
                        float* scratch, int max_shared, cudaStream_t s);
std::size_t layernorm_backward_shared_bytes(int C);

// ---- Llama-family blocks (llama.cu) ----
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* w, int N, int C, float eps,
                     cudaStream_t s);
template <typename T>
void rmsnorm_backward_input(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                            const float* rstd, int N, int C, cudaStream_t s);
// Deterministic column sums; `scratch` holds rmsnorm_backward_weight_scratch_floats(N, C)
// floats of device memory.
template <typename T>
void rmsnorm_backward_weight(float* dw, const T* dout, const T* inp, const float* rstd, int N,
                             int C, float* scratch, cudaStream_t s);
std::size_t rmsnorm_backward_weight_scratch_floats(int N, int C);
// Both, bit-identical to rmsnorm_backward_input then rmsnorm_backward_weight, in one pass
// over the rows (as layernorm_backward): rmsnorm_backward_weight_scratch_floats(N, C)
// floats of scratch and rmsnorm_backward_shared_bytes(C) of shared memory, at most
// max_shared.
template <typename T>
void rmsnorm_backward(T* dinp, const T* dresidual, const T* dout, const T* inp, const T* w,
                      const float* rstd, float* dw, int N, int C, float* scratch, int max_shared,
                      cudaStream_t s);
std::size_t rmsnorm_backward_shared_bytes(int C);
template <typename T> void swiglu_forward(T* out, const T* gate_up, int N, int F, cudaStream_t s);
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int N, int F, cudaStream_t s);
template <typename T>
void rope(T* x, int N, int T_, int stride, int heads, int head_size, float theta, bool inverse,
          int first,
          cudaStream_t s);

// ---- embedding (embedding.cu) ----
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int vocab_begin,
                       int vocab_rows, const T* wpe, int B, int T_, int C, cudaStream_t s);
// Deterministic: each output row of dwte is summed by one owner in position order.
// `scratch`: cuda_embedding_scratch_bytes(vocab_rows, B * T_) bytes of device memory.
template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens,
                        int vocab_begin, int vocab_rows, int B, int T_, int C, void* scratch,
                        cudaStream_t s);

// ---- cross-entropy (cross_entropy.cu), softmax over the vocabulary in fp32 ----
template <typename T>
void cross_entropy(float* losses, T* dlogits, const T* logits, const int32_t* targets, int N,
                   int V, int Vp, float dloss, cudaStream_t s);
// The vocab-parallel phases (ops::Ops's contract): phase 1 reads the row once, leaving the
// shard's largest value and its sum of exponentials scaled to it in stats; phase 2 scales
// that sum to the max over all shards and reads the target's logit (one thread a row).
template <typename T>
void ce_row_max(float* rowmax, float* stats, const T* logits, int N, int Vl, int col_begin, int V,
                cudaStream_t s);
template <typename T>
void ce_partial_sums(float* stats, const T* logits, const float* rowmax, const int32_t* targets,
                     int N, int Vl, int col_begin, int V, cudaStream_t s);
template <typename T>
void ce_finish(float* losses, T* dlogits, const T* logits, const float* rowmax,
               const float* stats, const int32_t* targets, int N, int Vl, int col_begin, int V,
               float dloss, cudaStream_t s);

// ---- attention pieces (attention.cu); the products in between are batched GEMMs ----
// qkv[B,T,W] (NH query heads, then NKV key and NKV value heads, of hs) -> q, k, v each
// [B,NH,T,hs]; head h of k and v is key/value head h / (NH/NKV).
template <typename T>
void split_heads(T* q, T* k, T* v, const T* qkv, int B, int T_, int NH, int NKV, int hs,
                 cudaStream_t s);
// y[B,NH,T,hs] -> out[B,T,NH*hs].
template <typename T>
void merge_heads(T* out, const T* y, int B, int T_, int NH, int hs, cudaStream_t s);
// The inverse of merge_heads: dout[B,T,NH*hs] -> dy[B,NH,T,hs].
template <typename T>
void split_heads_grad(T* dy, const T* dout, int B, int T_, int NH, int hs, cudaStream_t s);
// The adjoint of split_heads: dq, dk, dv [B,NH,T,hs] -> dqkv[B,T,W]; a key/value head's
// gradient is the sum of its query heads' (fp32, in head order).
template <typename T>
void merge_qkv_grad(T* dqkv, const T* dq, const T* dk, const T* dv, int B, int T_, int NH, int NKV,
                    int hs, cudaStream_t s);
// In place over rows of att[BH,T,T]: row t becomes softmax(scale * att[t, 0..t]) with
// the entries above the diagonal set to 0.
template <typename T> void causal_softmax_forward(T* att, float scale, int BH, int T_, cudaStream_t s);
// In place: datt[BH,T,T] (dL/d probabilities) becomes dL/d(raw scores) =
// scale * p * (datt - sum_j p_j datt_j), 0 above the diagonal; p = the saved att.
template <typename T>
void causal_softmax_backward(T* datt, const T* att, float scale, int BH, int T_, cudaStream_t s);

// ---- ring attention's steps (ring_attention.cu): ops::Ops::ring_attention_*_step on
// pieces q (rows of q|k|v) and kv (rows of k|v), each with the position of its first ----
template <typename T>
void ring_attention_forward_step(T* out, float* lse, const T* q, int q_first, int q_len,
                                 const T* kv, int kv_first, int kv_len, int B, int NH, int NKV,
                                 int hs, bool write, cudaStream_t s);
template <typename T>
void ring_attention_backward_step(T* dq, T* dkv, const T* dout, const T* out, const float* lse,
                                  const T* q, int q_first, int q_len, const T* kv, int kv_first,
                                  int kv_len, int B, int NH, int NKV, int hs, cudaStream_t s);

// ---- optimizer and norms (optimizer.cu) ----
// The parts of the multi-tensor launchers: ops::AdamWSegment's and ops::Span's fields
// (this header leaves out ops.hpp: the emulator's tests include it under a namespace of
// their own).
struct AdamWTensor {
  std::size_t arena, param, state, n;
  float weight_decay;
};
struct SquaredArray {
  const float* data;
  std::size_t n;
};
// One AdamW update of every tensor (see ops::Ops::adamw_segments); weights may be null.
template <typename T>
void adamw(float* params, T* weights, const float* grads, float* m, float* v,
           const std::vector<AdamWTensor>& tensors, float lr, float beta1, float beta2,
           float one_minus_beta1, float one_minus_beta2, float eps, float inv_bc1, float inv_bc2,
           float grad_scale, const float* control, const float* schedule, cudaStream_t s);
// *out = the sum over the spans of x^2 in fp64, deterministic. `partials` holds at least
// sum_squares_partials(spans) doubles of device memory.
void sum_squares(double* out, const std::vector<SquaredArray>& spans, double* partials,
                 cudaStream_t s);
std::size_t sum_squares_partials(std::size_t spans);
// *total += double(float(sum of x / n)) (ops::Ops::add_mean); n >= 1.
void add_mean(double* total, const float* x, std::size_t n, cudaStream_t s);
// ops::Ops::update_control.
void update_control(float* control, const double* stats, double grad_clip, cudaStream_t s);

}  // namespace pptrain::ops::cuda
