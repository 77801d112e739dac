// The numeric backend interface: every op the GPT model needs, on fp32 row-major
// arrays in the backend's memory. The model is written once against this
// interface; the CPU backend (ops/cpu) is the reference and a CUDA backend plugs
// in behind the same calls. Backward ops are split into an input-gradient part and
// a weight-gradient part so pipeline schedules can move the latter.
// "+=" in a comment means the op accumulates into its output.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace pptrain::ops {

class Ops {
 public:
  virtual ~Ops() = default;

  // C[M,N] = alpha * op(A) @ op(B) + beta * C. op(A) is [M,K], op(B) is [K,N];
  // A is stored [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b).
  virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    const float* B, float beta, float* C) = 0;
  // out[n,c] += bias[c] for n < N.
  virtual void add_bias(float* out, const float* bias, int N, int C) = 0;
  // dbias[c] += sum_n dout[n,c].
  virtual void bias_backward(float* dbias, const float* dout, int N, int C) = 0;

  // out[n,:] = (inp[n,:] - mean) * rstd * w + b; saves mean[N], rstd[N]. eps = 1e-5.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int N, int C) = 0;
  // dinp += d(out)/d(inp)^T dout.
  virtual void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                        const float* w, const float* mean, const float* rstd,
                                        int N, int C) = 0;
  // dw += sum_n dout * xhat; db += sum_n dout.
  virtual void layernorm_backward_weight(float* dw, float* db, const float* dout,
                                         const float* inp, const float* mean, const float* rstd,
                                         int N, int C) = 0;

  // GELU, tanh approximation (GPT-2's "gelu_new").
  virtual void gelu_forward(float* out, const float* inp, std::size_t n) = 0;
  // dinp = gelu'(inp) * dout (overwrites).
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) = 0;

  // Causal multi-head self-attention core. qkv[B,T,3C] holds q|k|v, each split into
  // NH heads of C/NH; out[B,T,C]; att[B,NH,T,T] receives the softmax probabilities
  // (entries above the diagonal are 0). Scale 1/sqrt(C/NH).
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                                 int NH) = 0;
  // dqkv = gradient w.r.t. qkv (overwrites), from dout[B,T,C] and the saved att.
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int C, int NH) = 0;

  // Vocab-parallel embedding: wte holds the rows [vocab_begin, vocab_begin+vocab_rows)
  // of the token table. out[b,t,:] = wte[tokens[b,t]-vocab_begin,:] for tokens in that
  // range, 0 for others; plus wpe[t,:] when wpe is not null.
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 int vocab_begin, int vocab_rows, const float* wpe, int B, int T,
                                 int C) = 0;
  // dwte[tokens[b,t]-vocab_begin,:] += dout[b,t,:] for tokens in range;
  // dwpe[t,:] += dout[b,t,:] when dwpe is not null.
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int vocab_begin, int vocab_rows, int B,
                                  int T, int C) = 0;

  // Softmax cross-entropy over the first V of Vp columns of logits[N,Vp] (the padded
  // columns are masked out). losses[n] = -log p[n, targets[n]];
  // dlogits[n,:] = dloss * (p[n,:] - onehot(targets[n])), 0 on padded columns.
  // dlogits may alias logits. dlogits == nullptr computes the loss only.
  virtual void cross_entropy(float* losses, float* dlogits, const float* logits,
                             const int32_t* targets, int N, int V, int Vp, float dloss) = 0;

  // Vocab-parallel cross-entropy in three phases, for logits[N,Vl] that hold the
  // columns [col_begin, col_begin+Vl) of the padded vocabulary (global columns >= V are
  // padding). Between phases the caller all-reduces over the tensor-parallel group:
  // rowmax with MAX after phase 1, stats with SUM after phase 2.
  // 1. rowmax[n] = max over this shard's real columns (-inf when it has none).
  virtual void ce_row_max(float* rowmax, const float* logits, int N, int Vl, int col_begin,
                          int V) = 0;
  // 2. stats[2n] = sum over real columns of exp(logit - rowmax[n]); stats[2n+1] = the
  //    target's logit when its column is in this shard, else 0.
  virtual void ce_partial_sums(float* stats, const float* logits, const float* rowmax,
                               const int32_t* targets, int N, int Vl, int col_begin, int V) = 0;
  // 3. losses[n] = log(stats[2n]) + rowmax[n] - stats[2n+1]; when dlogits is not null
  //    (it may alias logits) dlogits = dloss * (p - onehot(target)), 0 on padding.
  virtual void ce_finish(float* losses, float* dlogits, const float* logits, const float* rowmax,
                         const float* stats, const int32_t* targets, int N, int Vl, int col_begin,
                         int V, float dloss) = 0;

  // out = a + b, elementwise (out may alias a or b).
  virtual void add(float* out, const float* a, const float* b, std::size_t n) = 0;
  // dst += src.
  virtual void accumulate(float* dst, const float* src, std::size_t n) = 0;
};

// The fp32 CPU reference backend; GEMMs through OpenBLAS with `threads` threads
// (0: all cores).
std::unique_ptr<Ops> make_cpu_ops(int threads = 0);

}  // namespace pptrain::ops
