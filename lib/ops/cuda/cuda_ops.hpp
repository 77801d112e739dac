// The CUDA backend's class. Private to lib/ops (and its tests): the rest of the code
// base sees only pptrain::ops::Ops and make_cuda_ops. Every op is queued on one
// compute stream (native_stream()); matrix products go through cuBLASLt (gemm.hpp),
// everything else through the launchers of kernels.hpp, instantiated for the compute
// dtype (float or bf16), and, when asked for, the fused attention kernels of
// flash_attention.hpp. The bodies are in cuda_ops.cpp (memory, copies, GEMMs),
// cuda_ops_math.cpp (the elementwise, normalisation, loss and optimizer ops) and
// cuda_ops_attention.cpp. Like every backend object it must not be called from two
// threads at once; the calling thread must have this device current (the constructor
// makes it current on the constructing thread).
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "ops/cuda/cuda_raii.hpp"
#include "ops/cuda/gemm.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/memory_tracker.hpp"
#include "ops/ops.hpp"

namespace pptrain::ops {

namespace cuda {
// An Act array seen as its concrete element type T (float or bf16).
template <typename T>
T* typed(Act* p) {
  return reinterpret_cast<T*>(p);
}
template <typename T>
const T* typed(const Act* p) {
  return reinterpret_cast<const T*>(p);
}
// A launcher argument for element type T: an Act array typed as T, others as they are.
template <typename T, typename A>
auto typed_arg(A a) {
  if constexpr (std::is_same_v<A, Act*> || std::is_same_v<A, const Act*>)
    return typed<T>(a);
  else
    return a;
}
}  // namespace cuda

class CudaOps final : public Ops {
 public:
  // fuse_epilogues: fold bias and bias+GELU into the cuBLASLt product where cuBLASLt
  // offers it (otherwise a plain product and own kernels, as when it does not).
  // flash_attention: the fused attention kernels (bf16 only; an fp32 backend keeps
  // the unfused path, the exactness reference). See cuda_ops_attention.cpp.
  CudaOps(int device, DType compute, bool fuse_epilogues = true, bool flash_attention = false);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  std::string name() const override;
  DType compute_dtype() const override { return dtype_; }
  bool device_memory() const override { return true; }
  std::size_t device_memory_free() const override;
  void* allocate(std::size_t bytes) override;
  void deallocate(void* p) noexcept override;
  void upload(void* dst, const void* host_src, std::size_t bytes) override;
  void download(void* host_dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void fill_zero(void* dst, std::size_t bytes) override;
  void synchronize() override;
  void* allocate_host(std::size_t bytes) override;
  void free_host(void* p) noexcept override;
  void begin_capture() override;
  void end_capture() override;
  void replay() override;
  bool replayable() const override { return graph_.get() != nullptr; }
  void download_async(void* host_dst, const void* src, std::size_t bytes) override;
  std::size_t mark() override;
  void wait_queue(const std::function<void()>& poll) override;
  std::vector<double> take_marks() override;
  HostWaitCounter* host_waits() override { return &waits_; }
  void* native_stream() override { return stream_.get(); }
  std::size_t peak_memory_bytes() const override { return memory_.peak(); }
  std::optional<KernelCounters> kernel_counters() const override;
  std::string device_model() const override { return device_model_; }

  void to_compute(Act* dst, const float* src, std::size_t n) override;
  void to_float(float* dst, const Act* src, std::size_t n) override;
  double sum_squares(const std::vector<Span>& spans) override;
  void sum_squares_to(double* out, const std::vector<Span>& spans) override;
  void add_mean(double* total, const float* x, std::size_t n) override;
  void update_control(float* control, const double* stats, double grad_clip) override;
  void adamw_segments(float* params, Act* weights, const float* grads, float* m, float* v,
                      const std::vector<AdamWSegment>& segments, const AdamWStep& h) override;

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const Act* A,
            const Act* B, float beta, Act* C) override;
  void linear_forward(Act* out, Act* gelu_out, const Act* inp, const Act* w, const Act* bias, int N,
                      int Cin, int Cout) override;
  void gemm_residual(bool trans_b, int M, int N, int K, const Act* A, const Act* B,
                     const Act* bias, const Act* R, Act* D) override;
  void linear_backward_input(Act* dinp, const Act* dout, const Act* w, const Act* gelu_inp, int N,
                             int Cin, int Cout) override;
  void linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                          int Cout) override;
  void linear_grads(float* dw, float* dbias, const Act* inp, const Act* dout, int N, int Cin,
                    int Cout) override;
  void add_bias(Act* out, const Act* bias, int N, int C) override;
  void bias_backward(float* dbias, const Act* dout, int N, int C) override;

  void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w,
                         const Act* b, int N, int C) override;
  void layernorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                                const Act* w, const float* mean, const float* rstd, int N,
                                int C) override;
  void layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                 const float* mean, const float* rstd, int N, int C) override;
  void layernorm_backward(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                          const Act* w, const float* mean, const float* rstd, float* dw, float* db,
                          int N, int C) override;
  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* w, int N, int C,
                       float eps) override;
  void rmsnorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                              const Act* w, const float* rstd, int N, int C) override;
  void rmsnorm_backward_weight(float* dw, const Act* dout, const Act* inp, const float* rstd,
                               int N, int C) override;
  void rmsnorm_backward(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                        const Act* w, const float* rstd, float* dw, int N, int C) override;
  void swiglu_forward(Act* out, const Act* gate_up, int N, int F) override;
  void swiglu_backward(Act* dgate_up, const Act* dout, const Act* gate_up, int N,
                       int F) override;
  void rope(Act* x, int N, int T, int stride, int heads, int head_size, float theta, bool inverse,
            int first) override;
  void gelu_forward(Act* out, const Act* inp, std::size_t n) override;
  void gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) override;

  std::size_t attention_state_bytes(int B, int T, int NH) const override;
  void attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C, int NH,
                         int NKV) override;
  void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                          const void* state, int B, int T, int C, int NH, int NKV) override;
  // The state is the rows' fp32 log-sum-exps (ring_attention.cu).
  void ring_attention_forward_step(Act* out, void* state, SeqPiece q, SeqPiece kv, int B, int C,
                                   int NH, int NKV, bool write) override;
  void ring_attention_backward_step(Act* dq, Act* dkv, const Act* dout, const Act* out,
                                    const void* state, SeqPiece q, SeqPiece kv, int B, int C,
                                    int NH, int NKV) override;

  void embedding_forward(Act* out, const int32_t* tokens, const Act* wte, int vocab_begin,
                         int vocab_rows, const Act* wpe, int B, int T, int C) override;
  void embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                          int vocab_begin, int vocab_rows, int B, int T, int C) override;
  void cross_entropy(float* losses, Act* dlogits, const Act* logits, const int32_t* targets, int N,
                     int V, int Vp, float dloss) override;
  void ce_row_max(float* rowmax, float* stats, const Act* logits, int N, int Vl, int col_begin,
                  int V) override;
  void ce_partial_sums(float* stats, const Act* logits, const float* rowmax, const int32_t* targets,
                       int N, int Vl, int col_begin, int V) override;
  void ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                 const float* stats, const int32_t* targets, int N, int Vl, int col_begin, int V,
                 float dloss) override;

  void add(Act* out, const Act* a, const Act* b, std::size_t n) override;
  void copy_columns(Act* dst, int dst_width, int dst_col, const Act* src, int src_width,
                    int src_col, int rows, int cols) override;

 private:
  // The dtype dispatch: calls launch(args..., stream()) with each Act array argument
  // typed as the compute dtype's element type (float or bf16) and the others as they
  // are, so a launcher template of kernels.hpp deduces its T from them.
  template <typename Launch, typename... Args>
  void launch_typed(Launch launch, Args... args) const {
    if (dtype_ == DType::BF16)
      launch(cuda::typed_arg<cuda::bf16>(args)..., stream());
    else
      launch(cuda::typed_arg<float>(args)..., stream());
  }
  cudaStream_t stream() const { return stream_.get(); }
  // True when attention uses the fused kernels' state (the rows' logsumexp).
  bool flash_active() const { return flash_attention_ && dtype_ == DType::BF16; }
  // True when the ring's steps run the fused kernels on pieces for head size hs.
  bool flash_ring(int hs) const;
  // The unfused attention's pieces (cuda_ops_attention.cpp): q, k, v split into NH heads
  // each and att = causal softmax of the scaled scores; and the backward from there.
  void attention_probs(Act* att, Act* q, Act* k, Act* v, const Act* qkv, int B, int T, int NH,
                       int NKV, int hs);
  void attention_unfused_backward(Act* dqkv, const Act* dout, const Act* att, Act* q, Act* k,
                                  Act* v, Act* ws, int B, int T, int NH, int NKV, int hs);
  // At least `bytes` of scratch device memory, valid until the next call (grow-only;
  // each op asks once, before queuing work on it).
  void* workspace(std::size_t bytes);
  void update_peak();

  int device_;  // first: made current before the members below are created
  DType dtype_;
  bool fuse_epilogues_;
  bool flash_attention_;
  int max_smem_optin_;  // shared memory a block may opt into (bytes)
  std::string device_model_;
  cuda::Stream stream_;
  cuda::Gemm gemm_;
  cuda::DeviceMemory workspace_;
  cuda::DeviceMemory sum_out_{sizeof(double)};  // sum_squares' result
  // Workspaces outgrown since the last wait_queue: queued work may still use them, and
  // freeing them now would make the host wait.
  std::vector<cuda::DeviceMemory> retired_;
  MemoryTracker memory_;
  HostWaitCounter waits_;
  // Timing events: those recorded since the last take_marks, then the free ones.
  std::vector<cuda::Event> marks_, free_marks_;
  cuda::Event queue_end_;  // wait_queue's event
  bool capturing_ = false;
  cuda::GraphExec graph_;  // the last capture
};

}  // namespace pptrain::ops
