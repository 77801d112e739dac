// The fp32 CPU backend's class, and the Act entry points it shares with the bf16-storage
// test backend (tests/model/bf16_cpu_ops.cpp). The rest of the code base sees only
// pptrain::ops::Ops and make_cpu_ops; tests use the fp32-array overloads directly. The op
// bodies are spread over cpu_ops.cpp (GEMM, through cpu_gemm.cpp; bias, embedding,
// elementwise), cpu_norm.cpp (LayerNorm, GELU), cpu_loss.cpp (cross-entropy) and
// cpu_attention.cpp.
// An object keeps scratch buffers between calls, so it must not be shared by
// threads that call it concurrently; results never depend on the scratch contents.
#pragma once
#include <chrono>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "ops/cpu/cpu_gemm.hpp"
#include "ops/memory_tracker.hpp"
#include "ops/ops.hpp"

namespace pptrain::ops {

class CpuOps;

// Act arrays that hold fp32 (the CPU backend's): handed to the fp32 op as they are.
struct Fp32Arrays {
  struct Input {
    const Act* p;
    const float* data() const { return reinterpret_cast<const float*>(p); }
  };
  struct Output {
    Act* p;
    float* data() const { return reinterpret_cast<float*>(p); }
    void store() const {}
  };
  static Input input(const Act* p, std::size_t /*n*/) { return {p}; }
  static Output output(Act* p, std::size_t /*n*/, bool /*reads*/) { return {p}; }
};

// Every ops::Ops entry point that is the CpuOps fp32 op of the same name, written once for
// each backend that runs its ops on CpuOps. Backend (the derived class) gives reference(),
// the CpuOps that runs them. Arrays says how an Act array of n elements is seen as fp32:
// Arrays::input(p, n).data() holds an input's values; Arrays::output(p, n, reads).data() is
// where the op writes (holding p's values first when the op reads them too), and its
// store() puts the result into p. A null array stays null. Cpu is a parameter only so
// that its members are looked up where the class is complete.
template <typename Backend, typename Arrays, typename Cpu = CpuOps>
class Fp32Forwarding : public Ops {
 public:
  // beta 0: C is only written (it may hold garbage).
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const Act* A, const Act* B,
            float beta, Act* C) override {
    const std::size_t c = elems(M, N);
    run(&Cpu::gemm, ta, tb, M, N, K, alpha, in(A, elems(M, K)), in(B, elems(K, N)), beta,
        beta == 0.0f ? out(C, c) : inout(C, c));
  }
  void linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                          int Cout) override {
    run(&Cpu::linear_weight_grad, dw, in(inp, elems(N, Cin)), in(dout, elems(N, Cout)), N, Cin,
        Cout);
  }
  void linear_grads(float* dw, float* dbias, const Act* inp, const Act* dout, int N, int Cin,
                    int Cout) override {
    run(&Cpu::linear_grads, dw, dbias, in(inp, elems(N, Cin)), in(dout, elems(N, Cout)), N, Cin,
        Cout);
  }
  void copy_columns(Act* dst, int dst_width, int dst_col, const Act* src, int src_width,
                    int src_col, int rows, int cols) override {
    run(&Cpu::copy_columns, inout(dst, elems(rows, dst_width)), dst_width, dst_col,
        in(src, elems(rows, src_width)), src_width, src_col, rows, cols);
  }
  void add_bias(Act* o, const Act* bias, int N, int C) override {
    run(&Cpu::add_bias, inout(o, elems(N, C)), in(bias, elems(C)), N, C);
  }
  void bias_backward(float* dbias, const Act* dout, int N, int C) override {
    run(&Cpu::bias_backward, dbias, in(dout, elems(N, C)), N, C);
  }
  void layernorm_forward(Act* o, float* mean, float* rstd, const Act* inp, const Act* w,
                         const Act* b, int N, int C) override {
    run(&Cpu::layernorm_forward, out(o, elems(N, C)), mean, rstd, in(inp, elems(N, C)),
        in(w, elems(C)), in(b, elems(C)), N, C);
  }
  void layernorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                                const Act* w, const float* mean, const float* rstd, int N,
                                int C) override {
    run(&Cpu::layernorm_backward_input, out(dinp, elems(N, C)), in(dresidual, elems(N, C)),
        in(dout, elems(N, C)), in(inp, elems(N, C)), in(w, elems(C)), mean, rstd, N, C);
  }
  void layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                 const float* mean, const float* rstd, int N, int C) override {
    run(&Cpu::layernorm_backward_weight, dw, db, in(dout, elems(N, C)), in(inp, elems(N, C)), mean,
        rstd, N, C);
  }
  void rmsnorm_forward(Act* o, float* rstd, const Act* inp, const Act* w, int N, int C,
                       float eps) override {
    run(&Cpu::rmsnorm_forward, out(o, elems(N, C)), rstd, in(inp, elems(N, C)), in(w, elems(C)),
        N, C, eps);
  }
  void rmsnorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                              const Act* w, const float* rstd, int N, int C) override {
    run(&Cpu::rmsnorm_backward_input, out(dinp, elems(N, C)), in(dresidual, elems(N, C)),
        in(dout, elems(N, C)), in(inp, elems(N, C)), in(w, elems(C)), rstd, N, C);
  }
  void rmsnorm_backward_weight(float* dw, const Act* dout, const Act* inp, const float* rstd,
                               int N, int C) override {
    run(&Cpu::rmsnorm_backward_weight, dw, in(dout, elems(N, C)), in(inp, elems(N, C)), rstd, N,
        C);
  }
  void swiglu_forward(Act* o, const Act* gate_up, int N, int F) override {
    run(&Cpu::swiglu_forward, out(o, elems(N, F)), in(gate_up, elems(N, 2 * F)), N, F);
  }
  void swiglu_backward(Act* dgate_up, const Act* dout, const Act* gate_up, int N,
                       int F) override {
    run(&Cpu::swiglu_backward, out(dgate_up, elems(N, 2 * F)), in(dout, elems(N, F)),
        in(gate_up, elems(N, 2 * F)), N, F);
  }
  // The blocked kernels' steps, whichever form attention_forward runs; the state is the
  // rows' fp32 log-sum-exps.
  void ring_attention_forward_step(Act* o, void* state, SeqPiece q, SeqPiece kv, int B, int C,
                                   int NH, int NKV, bool write) override {
    const int Wkv = 2 * (C / NH) * NKV, W = C + Wkv;
    run(&Cpu::ring_forward_step, inout(o, elems(B, q.len, C)), static_cast<float*>(state),
        in(q.rows, elems(B, q.len, W)), q.first, q.len, in(kv.rows, elems(B, kv.len, Wkv)),
        kv.first, kv.len, B, C, NH, NKV, write);
  }
  void ring_attention_backward_step(Act* dq, Act* dkv, const Act* dout, const Act* o,
                                    const void* state, SeqPiece q, SeqPiece kv, int B, int C,
                                    int NH, int NKV) override {
    const int Wkv = 2 * (C / NH) * NKV, W = C + Wkv;
    run(&Cpu::ring_backward_step, inout(dq, elems(B, q.len, W)),
        inout(dkv, elems(B, kv.len, Wkv)), in(dout, elems(B, q.len, C)), in(o, elems(B, q.len, C)),
        static_cast<const float*>(state), in(q.rows, elems(B, q.len, W)), q.first, q.len,
        in(kv.rows, elems(B, kv.len, Wkv)), kv.first, kv.len, B, C, NH, NKV);
  }
  void rope(Act* x, int N, int T, int stride, int heads, int head_size, float theta,
            bool inverse, int first) override {
    run(&Cpu::rope, inout(x, elems(N, stride)), N, T, stride, heads, head_size, theta, inverse,
        first);
  }
  void gelu_forward(Act* o, const Act* inp, std::size_t n) override {
    run(&Cpu::gelu_forward, out(o, n), in(inp, n), n);
  }
  void gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) override {
    run(&Cpu::gelu_backward, out(dinp, n), in(inp, n), in(dout, n), n);
  }
  void embedding_forward(Act* o, const int32_t* tokens, const Act* wte, int vocab_begin,
                         int vocab_rows, const Act* wpe, int B, int T, int C) override {
    run(&Cpu::embedding_forward, out(o, elems(B, T, C)), tokens, in(wte, elems(vocab_rows, C)),
        vocab_begin, vocab_rows, in(wpe, elems(T, C)), B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                          int vocab_begin, int vocab_rows, int B, int T, int C) override {
    run(&Cpu::embedding_backward, dwte, dwpe, in(dout, elems(B, T, C)), tokens, vocab_begin,
        vocab_rows, B, T, C);
  }
  void cross_entropy(float* losses, Act* dlogits, const Act* logits, const int32_t* targets, int N,
                     int V, int Vp, float dloss) override {
    run(&Cpu::cross_entropy, losses, out(dlogits, elems(N, Vp)), in(logits, elems(N, Vp)), targets,
        N, V, Vp, dloss);
  }
  // Phase 2 sums the row's exponentials from the row itself: phase 1 leaves stats alone.
  void ce_row_max(float* rowmax, float* /*stats*/, const Act* logits, int N, int Vl,
                  int col_begin, int V) override {
    run(&Cpu::ce_row_max, rowmax, in(logits, elems(N, Vl)), N, Vl, col_begin, V);
  }
  void ce_partial_sums(float* stats, const Act* logits, const float* rowmax, const int32_t* targets,
                       int N, int Vl, int col_begin, int V) override {
    run(&Cpu::ce_partial_sums, stats, in(logits, elems(N, Vl)), rowmax, targets, N, Vl, col_begin,
        V);
  }
  void ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                 const float* stats, const int32_t* targets, int N, int Vl, int col_begin, int V,
                 float dloss) override {
    run(&Cpu::ce_finish, losses, out(dlogits, elems(N, Vl)), in(logits, elems(N, Vl)), rowmax,
        stats, targets, N, Vl, col_begin, V, dloss);
  }
  void add(Act* o, const Act* a, const Act* b, std::size_t n) override {
    run(&Cpu::add, out(o, n), in(a, n), in(b, n), n);
  }

 protected:
  static std::size_t elems(long a, long b = 1, long c = 1) { return std::size_t(a * b * c); }

 private:
  // An Act argument: an input, or an output the op overwrites or (reads) updates.
  struct In {
    const Act* p;
    std::size_t n;
  };
  struct Out {
    Act* p;
    std::size_t n;
    bool reads;
  };
  static In in(const Act* p, std::size_t n) { return {p, n}; }
  static Out out(Act* p, std::size_t n) { return {p, n, false}; }
  static Out inout(Act* p, std::size_t n) { return {p, n, true}; }

  // Calls op with In and Out arguments seen through Arrays, the others as they are; then
  // stores the outputs.
  template <typename... P, typename... A>
  void run(void (Cpu::*op)(P...), A... args) {
    std::tuple views{view(args)...};
    Cpu& cpu = static_cast<Backend&>(*this).reference();
    std::apply([&](auto&... v) { (cpu.*op)(pass(v)...); }, views);
    std::apply([](auto&... v) { (store(v), ...); }, views);
  }
  template <typename A>
  static auto view(A a) {
    if constexpr (std::is_same_v<A, In>)
      return Arrays::input(a.p, a.n);
    else if constexpr (std::is_same_v<A, Out>)
      return Arrays::output(a.p, a.n, a.reads);
    else
      return a;
  }
  template <typename V>
  static auto pass(V& v) {
    if constexpr (requires { v.data(); })
      return v.data();
    else
      return v;
  }
  template <typename V>
  static void store(V& v) {
    if constexpr (requires { v.store(); }) v.store();
  }
};

// A piece of the sequence for the blocked attention kernels: its rows and the position
// of its first row in the whole sequence. The rows are q|k|v ([B, len, W], the qkv
// layout), or with kv_only k|v alone ([B, len, 2 Ckv], what the ring sends: usable only
// as the keys and values).
struct SeqChunk {
  const float* rows;
  int first;
  int len;
  bool kv_only = false;
};

class CpuOps final : public Fp32Forwarding<CpuOps, Fp32Arrays> {
 public:
  // blocked_attention: attention in blocks, saving no T x T probabilities.
  explicit CpuOps(int threads, bool blocked_attention = false);

  // ---- ops::Ops: memory is host memory, Act arrays are fp32 (cpu_backend.cpp); the
  // ops that are an fp32 op of the same name come from Fp32Forwarding ----
  CpuOps& reference() { return *this; }
  std::string name() const override;
  DType compute_dtype() const override { return DType::F32; }
  bool device_memory() const override { return false; }
  void* allocate(std::size_t bytes) override;
  void* allocate_zeroed(std::size_t bytes) override;
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
  void sum_squares_to(double* out, const std::vector<Span>& spans) override {
    *out = sum_squares(spans);
  }
  void add_mean(double* total, const float* x, std::size_t n) override;
  void update_control(float* control, const double* stats, double grad_clip) override;
  void adamw_segments(float* params, Act* weights, const float* grads, float* m, float* v,
                      const std::vector<AdamWSegment>& segments, const AdamWStep& h) override;
  // Host clock times: every op has finished when it returns.
  std::size_t mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return marks_.size() - 1;
  }
  std::vector<double> take_marks() override;
  // The attention kernel is chosen by blocked_attention; its state is not an Act array.
  std::size_t attention_state_bytes(int B, int T, int NH) const override;
  void attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C, int NH,
                         int NKV) override;
  void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                          const void* state, int B, int T, int C, int NH, int NKV) override;
  // The fp32 overload below: bias and GELU fused into each GEMM tile.
  void linear_forward(Act* out, Act* gelu_out, const Act* inp, const Act* w, const Act* bias,
                      int N, int Cin, int Cout) override;
  // The fp32 overload below: the bias and the residual added on each GEMM tile.
  void gemm_residual(bool trans_b, int M, int N, int K, const Act* A, const Act* B,
                     const Act* bias, const Act* R, Act* D) override;
  // The fp32 overload below: the GELU backward on each GEMM tile.
  void linear_backward_input(Act* dinp, const Act* dout, const Act* w, const Act* gelu_inp,
                             int N, int Cin, int Cout) override;

  // ---- The same ops on plain fp32 arrays: the reference the tests and the CUDA
  // backend's tests call directly (cpu_ops.cpp, cpu_norm.cpp, cpu_loss.cpp,
  // cpu_attention.cpp). attention's `att` is the [B,NH,T,T] probabilities. ----
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
            const float* B, float beta, float* C);
  // out = inp @ w (+ bias), gelu_out = gelu(out) when not null: the bias and GELU run on
  // each GEMM tile as it is computed.
  void linear_forward(float* out, float* gelu_out, const float* inp, const float* w,
                      const float* bias, int N, int Cin, int Cout);
  // D = A @ op(B) (+ bias) + R: each tile's bias and residual added once the tile is
  // complete, in the order and with the roundings of add_bias and add.
  void gemm_residual(bool trans_b, int M, int N, int K, const float* A, const float* B,
                     const float* bias, const float* R, float* D);
  // dinp = dout @ w^T, times gelu'(gelu_inp) when not null: the GELU backward runs on each
  // GEMM tile once it is complete.
  void linear_backward_input(float* dinp, const float* dout, const float* w,
                             const float* gelu_inp, int N, int Cin, int Cout);
  void linear_weight_grad(float* dw, const float* inp, const float* dout, int N, int Cin, int Cout);
  // linear_weight_grad, and dbias[c] += sum_n dout[n,c] when dbias is not null: taken
  // from dout's strips as the product packs them, in double per K block of rows, the
  // blocks' sums then added in order (so not the bits of bias_backward's single sum).
  void linear_grads(float* dw, float* dbias, const float* inp, const float* dout, int N,
                    int Cin, int Cout);
  void copy_columns(float* dst, int dst_width, int dst_col, const float* src, int src_width,
                    int src_col, int rows, int cols);
  void add_bias(float* out, const float* bias, int N, int C);
  void bias_backward(float* dbias, const float* dout, int N, int C);
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C);
  void layernorm_backward_input(float* dinp, const float* dresidual, const float* dout,
                                const float* inp, const float* w, const float* mean,
                                const float* rstd, int N, int C);
  void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int N, int C);
  void gelu_forward(float* out, const float* inp, std::size_t n);
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n);
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps);
  void rmsnorm_backward_input(float* dinp, const float* dresidual, const float* dout,
                              const float* inp, const float* w, const float* rstd, int N, int C);
  void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd,
                               int N, int C);
  void swiglu_forward(float* out, const float* gate_up, int N, int F);
  void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int N, int F);
  void rope(float* x, int N, int T, int stride, int heads, int head_size, float theta,
            bool inverse, int first = 0);
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                         int NKV);
  // The blocked (flash-style) form: `lse` [B,NH,T] is each row's log-sum-exp instead of
  // the probabilities (cpu_attention_blocked.cpp).
  void attention_forward_blocked(float* out, float* lse, const float* qkv, int B, int T, int C,
                                 int NH, int NKV);
  void attention_backward_blocked(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, int B, int T, int C, int NH,
                                  int NKV);
  // One step of ring attention (context parallelism): the queries of piece q against the
  // keys and values of piece kv, causal by position in the whole sequence. The forward
  // merges that attention into out [B,q.len,C] and lse [B,NH,q.len] (start from out 0
  // and lse -inf; after every piece of the sequence they are the whole-sequence
  // forward's rows of q; `write` overwrites them instead, for a kv piece every row of q
  // sees a key of). The backward, given those final out and lse, adds the step's
  // gradients to the q part of dq [B,q.len,W] and to the k/v parts of dkv, which has
  // kv's layout (W = C + 2 C NKV / NH, the qkv row width).
  void ring_attention_forward_step(float* out, float* lse, const SeqChunk& q, const SeqChunk& kv,
                                   int B, int C, int NH, int NKV, bool write = false);
  void ring_attention_backward_step(float* dq, float* dkv, const float* dout, const float* out,
                                    const float* lse, const SeqChunk& q, const SeqChunk& kv,
                                    int B, int C, int NH, int NKV);
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                          int B, int T, int C, int NH, int NKV);
  // The two steps on flat arrays (piece q's q|k|v rows from q_first, piece kv's k|v rows
  // from kv_first), for the Ops entry points.
  void ring_forward_step(float* out, float* lse, const float* q, int q_first, int q_len,
                         const float* kv, int kv_first, int kv_len, int B, int C, int NH, int NKV,
                         bool write) {
    ring_attention_forward_step(out, lse, {q, q_first, q_len}, {kv, kv_first, kv_len, true}, B, C,
                                NH, NKV, write);
  }
  void ring_backward_step(float* dq, float* dkv, const float* dout, const float* out,
                          const float* lse, const float* q, int q_first, int q_len,
                          const float* kv, int kv_first, int kv_len, int B, int C, int NH,
                          int NKV) {
    ring_attention_backward_step(dq, dkv, dout, out, lse, {q, q_first, q_len},
                                 {kv, kv_first, kv_len, true}, B, C, NH, NKV);
  }
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
  // The blocked kernels on pieces q and kv: merge (forward) into out and lse rather than
  // write them; accumulate (backward) into dq and dkv rather than write them.
  void blocked_forward(float* out, float* lse, const SeqChunk& q, const SeqChunk& kv, int B,
                       int C, int NH, int NKV, bool merge);
  void blocked_backward(float* dq, float* dkv, const float* dout, const float* out,
                        const float* lse, const SeqChunk& q, const SeqChunk& kv, int B, int C,
                        int NH, int NKV, bool accumulate);
  // Grow-only scratch, shared by the threads of one op call: per-thread attention tiles
  // and cross-entropy rows, double per-column sums for the column reductions and
  // per-chunk norm sums.
  static std::size_t blocked_tile_floats(int hs);  // per-thread scratch of the blocked kernels
  float* float_scratch(std::size_t n);
  float* thread_rows(int width);  // scratch: one row of `width` floats per OpenMP thread
  double* double_scratch(std::size_t n);
  cpu::GemmWorkspace* thread_gemm_workspaces();  // one per OpenMP thread, for gemm_serial

  std::vector<float> fscratch_;
  std::vector<double> dscratch_;
  cpu::GemmWorkspace gemm_workspace_;
  std::vector<cpu::GemmWorkspace> thread_gemm_workspaces_;
  cpu::GemmKernel gemm_kernel_ = cpu::best_gemm_kernel();
  int threads_;
  bool blocked_attention_;
  MemoryTracker memory_;  // what allocate() hands out (the scratch above is not counted)
  std::unordered_map<void*, std::size_t> mapped_;  // allocate's mappings: their lengths
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

// Rows per block in the causal attention GEMMs: a row block only meets the key
// columns up to its own last row, which skips most of the masked upper triangle.
inline constexpr int kAttentionRowBlock = 64;

// The qkv rows of the attention ops: NH query heads of hs = C/NH (C elements), then NKV
// key heads and NKV value heads of hs (Ckv elements each); W = C + 2*Ckv elements in all.
// Query head h uses key/value head h / group, group = NH/NKV.
struct AttentionLayout {
  int hs, C, Ckv, W, group;
  // Where key/value head kvh's k and v start in a row of q|k|v, or of k|v alone.
  std::size_t k_offset(int kvh, bool kv_only = false) const {
    return std::size_t(kv_only ? 0 : C) + std::size_t(kvh) * hs;
  }
  std::size_t v_offset(int kvh, bool kv_only = false) const {
    return k_offset(kvh, kv_only) + std::size_t(Ckv);
  }
  int width(bool kv_only) const { return kv_only ? 2 * Ckv : W; }  // a row's
};
// The layout of shape (B, T, C, NH, NKV); throws on a bad shape (cpu_attention.cpp).
AttentionLayout attention_layout(int B, int T, int C, int NH, int NKV);

}  // namespace pptrain::ops
