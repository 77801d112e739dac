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

  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int B, int T, int C) = 0;
  // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:].
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C) = 0;

  // Softmax cross-entropy over the first V of Vp columns of logits[N,Vp] (the padded
  // columns are masked out). losses[n] = -log p[n, targets[n]];
  // dlogits[n,:] = dloss * (p[n,:] - onehot(targets[n])), 0 on padded columns.
  // dlogits may alias logits. dlogits == nullptr computes the loss only.
  virtual void cross_entropy(float* losses, float* dlogits, const float* logits,
                             const int32_t* targets, int N, int V, int Vp, float dloss) = 0;

  // out = a + b, elementwise (out may alias a or b).
  virtual void add(float* out, const float* a, const float* b, std::size_t n) = 0;
  // dst += src.
  virtual void accumulate(float* dst, const float* src, std::size_t n) = 0;
};

// The fp32 CPU reference backend; GEMMs through OpenBLAS with `threads` threads
// (0: all cores).
std::unique_ptr<Ops> make_cpu_ops(int threads = 0);

}  // namespace pptrain::ops
