// The fp32 CPU backend's class. Private to lib/ops: the rest of the code base sees
// only pptrain::ops::Ops and make_cpu_ops. The op bodies are spread over
// cpu_ops.cpp (GEMM, bias, embedding, elementwise), cpu_norm.cpp (LayerNorm, GELU),
// cpu_loss.cpp (cross-entropy) and cpu_attention.cpp.
// An object keeps scratch buffers between calls, so it must not be shared by
// threads that call it concurrently; results never depend on the scratch contents.
#pragma once
#include <cstddef>
#include <vector>

#include "ops/ops.hpp"

namespace pptrain::ops {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads);

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
            const float* B, float beta, float* C) override;
  void add_bias(float* out, const float* bias, int N, int C) override;
  void bias_backward(float* dbias, const float* dout, int N, int C) override;

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override;
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                                const float* mean, const float* rstd, int N, int C) override;
  void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int N, int C) override;

  void gelu_forward(float* out, const float* inp, std::size_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) override;

  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                         int NH) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                          int T, int C, int NH) override;

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int vocab_begin,
                         int vocab_rows, const float* wpe, int B, int T, int C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int vocab_begin, int vocab_rows, int B, int T, int C) override;

  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int N, int V, int Vp, float dloss) override;
  void ce_row_max(float* rowmax, const float* logits, int N, int Vl, int col_begin,
                  int V) override;
  void ce_partial_sums(float* stats, const float* logits, const float* rowmax,
                       const int32_t* targets, int N, int Vl, int col_begin, int V) override;
  void ce_finish(float* losses, float* dlogits, const float* logits, const float* rowmax,
                 const float* stats, const int32_t* targets, int N, int Vl, int col_begin, int V,
                 float dloss) override;

  void add(float* out, const float* a, const float* b, std::size_t n) override;
  void accumulate(float* dst, const float* src, std::size_t n) override;

 private:
  // Grow-only scratch: a float [T,T] tile for attention backward and double
  // per-column sums for the column reductions.
  float* float_scratch(std::size_t n);
  double* double_scratch(std::size_t n);

  std::vector<float> fscratch_;
  std::vector<double> dscratch_;
};

// Rows per block in the causal attention GEMMs: a row block only meets the key
// columns up to its own last row, which skips most of the masked upper triangle.
inline constexpr int kAttentionRowBlock = 64;

}  // namespace pptrain::ops
