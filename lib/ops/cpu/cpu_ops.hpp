// The fp32 CPU backend's class. The rest of the code base sees only pptrain::ops::Ops
// and make_cpu_ops; tests use the fp32-array overloads directly. The op bodies are spread over
// cpu_ops.cpp (GEMM, bias, embedding, elementwise), cpu_norm.cpp (LayerNorm, GELU),
// cpu_loss.cpp (cross-entropy) and cpu_attention.cpp.
// An object keeps scratch buffers between calls, so it must not be shared by
// threads that call it concurrently; results never depend on the scratch contents.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "ops/memory_tracker.hpp"
#include "ops/ops.hpp"

namespace pptrain::ops {

class CpuOps final : public Ops {
 public:
  // blocked_attention: attention in blocks, saving no T x T probabilities.
  explicit CpuOps(int threads, bool blocked_attention = false);

  // ---- ops::Ops: memory is host memory, Act arrays are fp32 (cpu_backend.cpp) ----
  std::string name() const override;
  DType compute_dtype() const override { return DType::F32; }
  bool device_memory() const override { return false; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* p) noexcept override;
  void upload(void* dst, const void* host_src, std::size_t bytes) override;
  void download(void* host_dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void fill_zero(void* dst, std::size_t bytes) override;
  void synchronize() override {}
  std::size_t peak_memory_bytes() const override { return memory_.peak(); }
  void to_compute(Act* dst, const float* src, std::size_t n) override;
  void to_float(float* dst, const Act* src, std::size_t n) override;
  double sum_squares(const std::vector<Span>& spans) override;
  void adamw(float* params, Act* weights, const float* grads, float* m, float* v, std::size_t n,
             const AdamWStep& h) override;

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const Act* A,
            const Act* B, float beta, Act* C) override;
  void linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                          int Cout) override;
  void add_bias(Act* out, const Act* bias, int N, int C) override;
  void bias_backward(float* dbias, const Act* dout, int N, int C) override;
  void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w,
                         const Act* b, int N, int C) override;
  void layernorm_backward_input(Act* dinp, const Act* dout, const Act* inp, const Act* w,
                                const float* mean, const float* rstd, int N, int C) override;
  void layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                 const float* mean, const float* rstd, int N, int C) override;
  void gelu_forward(Act* out, const Act* inp, std::size_t n) override;
  void gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) override;
  std::size_t attention_state_bytes(int B, int T, int NH) const override;
  void attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C,
                         int NH) override;
  void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                          const void* state, int B, int T, int C, int NH) override;
  void embedding_forward(Act* out, const int32_t* tokens, const Act* wte, int vocab_begin,
                         int vocab_rows, const Act* wpe, int B, int T, int C) override;
  void embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                          int vocab_begin, int vocab_rows, int B, int T, int C) override;
  void cross_entropy(float* losses, Act* dlogits, const Act* logits, const int32_t* targets,
                     int N, int V, int Vp, float dloss) override;
  void ce_row_max(float* rowmax, const Act* logits, int N, int Vl, int col_begin,
                  int V) override;
  void ce_partial_sums(float* stats, const Act* logits, const float* rowmax,
                       const int32_t* targets, int N, int Vl, int col_begin, int V) override;
  void ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                 const float* stats, const int32_t* targets, int N, int Vl, int col_begin, int V,
                 float dloss) override;
  void add(Act* out, const Act* a, const Act* b, std::size_t n) override;

  // ---- The same ops on plain fp32 arrays: the reference the tests and the CUDA
  // backend's tests call directly (cpu_ops.cpp, cpu_norm.cpp, cpu_loss.cpp,
  // cpu_attention.cpp). attention's `att` is the [B,NH,T,T] probabilities. ----
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
            const float* B, float beta, float* C);
  void add_bias(float* out, const float* bias, int N, int C);
  void bias_backward(float* dbias, const float* dout, int N, int C);
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C);
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                                const float* mean, const float* rstd, int N, int C);
  void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int N, int C);
  void gelu_forward(float* out, const float* inp, std::size_t n);
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n);
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
  // The blocked (flash-style) form: `lse` [B,NH,T] is each row's log-sum-exp instead of
  // the probabilities (cpu_attention_blocked.cpp).
  void attention_forward_blocked(float* out, float* lse, const float* qkv, int B, int T, int C,
                                 int NH);
  void attention_backward_blocked(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, int B, int T, int C, int NH);
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                          int B, int T, int C, int NH);
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int vocab_begin,
                         int vocab_rows, const float* wpe, int B, int T, int C);
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int vocab_begin, int vocab_rows, int B, int T, int C);
  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int N, int V, int Vp, float dloss);
  void ce_row_max(float* rowmax, const float* logits, int N, int Vl, int col_begin, int V);
  void ce_partial_sums(float* stats, const float* logits, const float* rowmax,
                       const int32_t* targets, int N, int Vl, int col_begin, int V);
  void ce_finish(float* losses, float* dlogits, const float* logits, const float* rowmax,
                 const float* stats, const int32_t* targets, int N, int Vl, int col_begin, int V,
                 float dloss);
  void add(float* out, const float* a, const float* b, std::size_t n);

 private:
  // Grow-only scratch, shared by the threads of one op call: per-thread attention tiles
  // and cross-entropy rows, double per-column sums for the column reductions and
  // per-chunk norm sums.
  static std::size_t blocked_tile_floats(int hs);  // per-thread scratch of the blocked kernels
  float* float_scratch(std::size_t n);
  float* thread_rows(int width);  // scratch: one row of `width` floats per OpenMP thread
  double* double_scratch(std::size_t n);

  std::vector<float> fscratch_;
  std::vector<double> dscratch_;
  int threads_;
  bool blocked_attention_;
  MemoryTracker memory_;  // what allocate() hands out (the scratch above is not counted)
};

// Rows per block in the causal attention GEMMs: a row block only meets the key
// columns up to its own last row, which skips most of the masked upper triangle.
inline constexpr int kAttentionRowBlock = 64;

}  // namespace pptrain::ops
