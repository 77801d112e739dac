// The numeric backend interface: the memory and every op the GPT model needs, on
// row-major arrays in the backend's memory (host memory on the CPU, device memory on
// CUDA). The model is written once against this interface; the CPU backend (ops/cpu)
// is the fp32 reference and the CUDA backend (ops/cuda) plugs in behind the same calls.
//
// Types: `Act` arrays (activations, the weight copy the forward reads, logits) hold
// elements of the backend's compute_dtype() (fp32 on the CPU; bf16 or fp32 on CUDA);
// `float` arrays (master weights, parameter gradients, optimizer state, LayerNorm
// statistics, losses) are always fp32. Token and target arrays are int32 in backend
// memory. Backward ops are split into an input-gradient part and a weight-gradient
// part so pipeline schedules can move the latter. "+=" in a comment means the op
// accumulates into its output.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "core/host_waits.hpp"

namespace pptrain::ops {

// An element of an array in the backend's compute dtype: an incomplete type, so such
// arrays are only ever touched by the backend. Offsets go through advance().
struct Act;

inline Act* advance(Act* p, std::size_t n, DType t) {
  return reinterpret_cast<Act*>(reinterpret_cast<std::byte*>(p) + n * dtype_size(t));
}
inline const Act* advance(const Act* p, std::size_t n, DType t) {
  return reinterpret_cast<const Act*>(reinterpret_cast<const std::byte*>(p) + n * dtype_size(t));
}
// An fp32 array seen as Act (for backends whose compute dtype is fp32).
inline Act* as_act(float* p) { return reinterpret_cast<Act*>(p); }
inline const Act* as_act(const float* p) { return reinterpret_cast<const Act*>(p); }

// The hyper-parameters of one AdamW update (bias corrections already folded in).
struct AdamWStep {
  float lr, beta1, beta2;
  // 1 - beta in double, then rounded once: 1 minus the fp32 beta would be off by up to
  // u beta / (1 - beta) of itself (u = 2^-24; 216 u for beta 0.999, where the bound is
  // 999 u)
  float one_minus_beta1, one_minus_beta2;
  float eps, weight_decay;
  float inv_bias_correction1, inv_bias_correction2;  // 1/(1-beta^t)
  float grad_scale;                                   // clipping factor applied to g
  // When not null: the step's control in backend memory, written by update_control
  // (control[0] replaces grad_scale; control[1] == 0 leaves everything unchanged).
  const float* control = nullptr;
  // When not null: {lr, inv_bias_correction1, inv_bias_correction2} in backend memory,
  // read in place of those three (a captured update reads each replay's values).
  const float* schedule = nullptr;
};

// One parameter tensor's part of a multi-tensor AdamW update: n elements from index
// `arena` of the gradients (and of the weight copy), `param` of the parameters and
// `state` of the moments, with its weight decay (0 for biases and norms).
struct AdamWSegment {
  std::size_t arena, param, state, n;
  float weight_decay;
};

// One fp32 array in backend memory, for sum_squares.
struct Span {
  const float* data;
  std::size_t n;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // ---- Identity and memory ----
  virtual std::string name() const = 0;     // e.g. "cpu (fp32, OpenBLAS, 2 threads)"
  virtual DType compute_dtype() const = 0;  // element type of Act arrays
  virtual bool device_memory() const = 0;   // true: pointers are not host-readable
  // Device memory free now (bytes), for a backend whose memory is its own device's;
  // 0 on the CPU, whose memory is the host's (train/memory_check.hpp reads that).
  virtual std::size_t device_memory_free() const { return 0; }
  // 256-byte aligned backend memory with undefined contents; deallocate() frees it.
  virtual void* allocate(std::size_t bytes) = 0;
  // The same, all zero: for the long-lived arenas (parameters, gradients, optimizer
  // state). The CPU backend maps large ones on huge pages.
  virtual void* allocate_zeroed(std::size_t bytes) {
    void* p = allocate(bytes);
    fill_zero(p, bytes);
    return p;
  }
  virtual void deallocate(void* p) noexcept = 0;
  // From allocate_host's memory the copy may run later, in the queue: the host leaves the
  // source as it is until the next wait_queue().
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  // Waits for the work queued before it, then copies to host memory.
  virtual void download(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // dst[r, dst_col + c] = src[r, src_col + c] for r < rows, c < cols: a block of columns
  // from one row-major array (rows src_width wide) into another (dst_width); the rest of
  // dst stays as it is. (The ring's k|v columns of q|k|v, and their gradient back.)
  virtual void copy_columns(Act* dst, int dst_width, int dst_col, const Act* src, int src_width,
                            int src_col, int rows, int cols) = 0;
  virtual void fill_zero(void* dst, std::size_t bytes) = 0;
  // Waits until every queued op has finished (a no-op on the CPU).
  virtual void synchronize() = 0;

  // ---- The host and the queue: a device backend queues every op (the CPU runs it at
  // once); these let a training step run without the host waiting until its end ----
  // Host memory that download_async may copy into (pinned on CUDA); free_host frees it.
  virtual void* allocate_host(std::size_t bytes);
  virtual void free_host(void* p) noexcept;
  struct FreeHost {  // a deleter: std::unique_ptr<T, Ops::FreeHost>{allocate_host(...), {ops}}
    Ops* ops;
    void operator()(void* p) const noexcept { ops->free_host(p); }
  };
  // Queues a copy into host memory from allocate_host, complete after the next
  // wait_queue(); the host must not read it earlier.
  virtual void download_async(void* host_dst, const void* src, std::size_t bytes) {
    download(host_dst, src, bytes);
  }
  // Records a point in the queue, after the work queued so far, for timing; returns its
  // index in what the next take_marks() gives.
  virtual std::size_t mark() = 0;
  // Waits until every queued op has finished, calling `poll` between checks (the
  // communicators' watchdog); a device backend counts this as one host wait.
  virtual void wait_queue(const std::function<void()>& poll) { (void)poll; synchronize(); }
  // After wait_queue(): the seconds from the first mark to each mark since the last
  // call (the device's clock on CUDA, the host's on the CPU); clears them.
  virtual std::vector<double> take_marks() = 0;
  // The device's count of host waits (null on the CPU, where the host never waits).
  virtual HostWaitCounter* host_waits() { return nullptr; }
  // A graph: between begin_capture() and end_capture() the work the backend is asked to
  // queue is recorded, not run (nothing may wait for the device, no allocation may be
  // freed, uploads come from allocate_host's memory, no marks are taken); replay()
  // queues all of it again, as often as it is called, while replayable(): until device
  // memory is freed (a graph may read it). Backends without graphs (the CPU) throw
  // std::logic_error.
  virtual void begin_capture();
  virtual void end_capture();
  virtual void replay();
  virtual bool replayable() const { return false; }
  // The native queue ops run on (a cudaStream_t on CUDA, null on the CPU), so a
  // communicator can order its work after theirs.
  virtual void* native_stream() { return nullptr; }
  // Most backend memory held at once so far (bytes; 0 when the backend does not track it).
  virtual std::size_t peak_memory_bytes() const { return 0; }
  // What the device's kernels have done so far, where the runtime counts it (the CUDA
  // emulator: tests/ops/emulation/emulator_counters.hpp); nullopt elsewhere.
  struct KernelCounters {
    std::uint64_t launches = 0, global_bytes = 0, shared_bytes = 0, mma_ops = 0;
  };
  virtual std::optional<KernelCounters> kernel_counters() const { return std::nullopt; }
  // The accelerator's model name for MFU's peak table ("" on the CPU).
  virtual std::string device_model() const { return {}; }

  // ---- Precision and optimizer ----
  // dst = src rounded to the compute dtype (a copy when it is fp32).
  virtual void to_compute(Act* dst, const float* src, std::size_t n) = 0;
  // dst = src widened to fp32.
  virtual void to_float(float* dst, const Act* src, std::size_t n) = 0;
  // Sum over the spans of x^2, accumulated in fp64 in a fixed order (deterministic).
  virtual double sum_squares(const std::vector<Span>& spans) = 0;
  // *out = the same sum, left in backend memory (no wait).
  virtual void sum_squares_to(double* out, const std::vector<Span>& spans) = 0;
  // *total += double(float(mean of x[0, n))): the sum in fp64 in a fixed order, divided
  // by n and rounded to fp32 once (a micro-batch's mean loss), in backend memory.
  virtual void add_mean(double* total, const float* x, std::size_t n) = 0;
  // The control an update reads (AdamWStep::control), from stats[0] (a loss) and stats[1]
  // (a squared gradient norm), in backend memory: with norm = sqrt(stats[1]),
  // control[0] = float(grad_clip / (norm + 1e-6)) when grad_clip > 0 and norm > grad_clip,
  // else 1; control[1] = 1 when stats[0] and norm are finite, else 0 (no update).
  virtual void update_control(float* control, const double* stats, double grad_clip) = 0;
  // One AdamW update of every segment (multi-tensor: one pass, not one per tensor):
  // g = grad_scale * grads; m, v updated; params updated (decoupled weight decay, the
  // segment's; h.weight_decay is not read); weights (if not null) = params in compute
  // dtype. Each element's arithmetic is its own: the bits do not depend on how the
  // elements are split into segments.
  virtual void adamw_segments(float* params, Act* weights, const float* grads, float* m,
                              float* v, const std::vector<AdamWSegment>& segments,
                              const AdamWStep& h) = 0;
  // The same for one tensor of n elements with h.weight_decay.
  void adamw(float* params, Act* weights, const float* grads, float* m, float* v, std::size_t n,
             const AdamWStep& h) {
    adamw_segments(params, weights, grads, m, v, {{0, 0, 0, n, h.weight_decay}}, h);
  }

  // ---- Matrix products ----
  // C[M,N] = alpha * op(A) @ op(B) + beta * C. op(A) is [M,K], op(B) is [K,N];
  // A is stored [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b).
  virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const Act* A,
                    const Act* B, float beta, Act* C) = 0;
  // A linear layer: out[N,Cout] = inp[N,Cin] @ w[Cin,Cout] (+ bias[Cout] when bias is not
  // null); when gelu_out is not null also gelu_out = gelu(out). Backends fuse the bias and
  // GELU into the product where they can.
  virtual void linear_forward(Act* out, Act* gelu_out, const Act* inp, const Act* w,
                              const Act* bias, int N, int Cin, int Cout);
  // A row-parallel projection with its residual (where nothing is summed over tp):
  // D[M,N] = op(A)[M,K] op(B)[K,N] + bias[N] (when not null) + R[M,N], added in that
  // order; B is [K,N], or [N,K] when trans_b. D may not alias A, B or R. Backends fuse the
  // bias and R into the product where they can.
  virtual void gemm_residual(bool trans_b, int M, int N, int K, const Act* A, const Act* B,
                             const Act* bias, const Act* R, Act* D);
  // Input gradient of a linear layer: dinp[N,Cin] = dout[N,Cout] @ w[Cin,Cout]^T; when
  // gelu_inp is not null the layer's input was gelu(gelu_inp), and dinp is the gradient
  // with respect to gelu_inp (times gelu'(gelu_inp)). Backends fuse the GELU backward into
  // the product where they can.
  virtual void linear_backward_input(Act* dinp, const Act* dout, const Act* w,
                                     const Act* gelu_inp, int N, int Cin, int Cout);
  // Weight gradient of a linear layer: dw[Cin,Cout] += inp[N,Cin]^T @ dout[N,Cout], fp32.
  virtual void linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                                  int Cout) = 0;
  // Weight and bias gradients of a linear layer: linear_weight_grad, then, when dbias is
  // not null, dbias[c] += sum_n dout[n,c]. Backends take the bias sum from the product
  // where they can.
  virtual void linear_grads(float* dw, float* dbias, const Act* inp, const Act* dout, int N,
                            int Cin, int Cout);
  // out[n,c] += bias[c] for n < N.
  virtual void add_bias(Act* out, const Act* bias, int N, int C) = 0;
  // dbias[c] += sum_n dout[n,c].
  virtual void bias_backward(float* dbias, const Act* dout, int N, int C) = 0;

  // ---- Normalisation and activation ----
  // out[n,:] = (inp[n,:] - mean) * rstd * w + b; saves mean[N], rstd[N]. eps = 1e-5.
  virtual void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp,
                                 const Act* w, const Act* b, int N, int C) = 0;
  // dinp = dresidual + d(out)/d(inp)^T dout: the gradient from the residual path (it may
  // be dinp itself, which then accumulates) plus the norm's.
  virtual void layernorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout,
                                        const Act* inp, const Act* w, const float* mean,
                                        const float* rstd, int N, int C) = 0;
  // dw += sum_n dout * xhat; db += sum_n dout.
  virtual void layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                         const float* mean, const float* rstd, int N, int C) = 0;
  // layernorm_backward_input, then layernorm_backward_weight (B and W of the norm
  // together), with their results bit for bit: a backend may do both in one pass.
  virtual void layernorm_backward(Act* dinp, const Act* dresidual, const Act* dout,
                                  const Act* inp, const Act* w, const float* mean,
                                  const float* rstd, float* dw, float* db, int N, int C);
  // GELU, tanh approximation (GPT-2's "gelu_new").
  virtual void gelu_forward(Act* out, const Act* inp, std::size_t n) = 0;
  // dinp = gelu'(inp) * dout (overwrites; dinp may alias dout).
  virtual void gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) = 0;

  // ---- Llama-family blocks (Hugging Face LlamaForCausalLM's conventions) ----
  // RMSNorm: out[n,:] = inp[n,:] * rstd[n] * w, rstd = 1/sqrt(mean(inp[n,:]^2) + eps);
  // saves rstd[N].
  virtual void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* w, int N, int C,
                               float eps) = 0;
  // dinp = dresidual + d(out)/d(inp)^T dout (as layernorm_backward_input).
  virtual void rmsnorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout,
                                      const Act* inp, const Act* w, const float* rstd, int N,
                                      int C) = 0;
  // dw += sum_n dout * inp * rstd.
  virtual void rmsnorm_backward_weight(float* dw, const Act* dout, const Act* inp,
                                       const float* rstd, int N, int C) = 0;
  // rmsnorm_backward_input, then rmsnorm_backward_weight, bit for bit (as
  // layernorm_backward).
  virtual void rmsnorm_backward(Act* dinp, const Act* dresidual, const Act* dout,
                                const Act* inp, const Act* w, const float* rstd, float* dw, int N,
                                int C);
  // SwiGLU: gate_up[N, 2F] holds the gate's F columns, then the up projection's;
  // out[N, F] = silu(gate) * up.
  virtual void swiglu_forward(Act* out, const Act* gate_up, int N, int F) = 0;
  // dgate_up[N, 2F] = the gradients of gate and up from dout[N, F] (overwrites).
  virtual void swiglu_backward(Act* dgate_up, const Act* dout, const Act* gate_up, int N,
                               int F) = 0;
  // Rotary position embedding in place, the rotate-half form: row n of x (`stride`
  // elements apart) is at position first + n % T (first: where the rows' piece of the
  // sequence starts, 0 for whole sequences); each of its first `heads` heads of
  // `head_size` (even) elements has element i paired with i + head_size/2 and the pair
  // rotated by the angle position * theta^(-2i/head_size) (fp32, as Hugging Face
  // computes it). inverse: the opposite rotation, which is the backward.
  virtual void rope(Act* x, int N, int T, int stride, int heads, int head_size, float theta,
                    bool inverse, int first) = 0;

  // ---- Attention ----
  // Bytes of the state attention_forward saves for its backward, per query head (the
  // CPU saves the [B,NH,T,T] probabilities; a fused kernel saves less).
  virtual std::size_t attention_state_bytes(int B, int T, int NH) const = 0;
  // Causal self-attention core with grouped key/value heads (NKV divides NH; NKV == NH
  // is multi-head attention). A qkv row of W = C + 2*Ckv elements holds q (NH heads of
  // hs = C/NH), then k and v (NKV heads of hs each, Ckv = NKV*hs); query head h attends
  // with key/value head h / (NH/NKV). qkv[B,T,W], out[B,T,C]. Scale 1/sqrt(hs).
  virtual void attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C,
                                 int NH, int NKV) = 0;
  // dqkv[B,T,W] = gradient w.r.t. qkv (overwrites; a key/value head's is the sum over its
  // query heads), from dout[B,T,C] and the saved state. out: the forward's output,
  // unchanged since (a backend may read it instead of recomputing it).
  virtual void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                                  const void* state, int B, int T, int C, int NH, int NKV) = 0;

  // ---- Ring attention (context parallelism) ----
  // A piece of the sequence: its rows ([B, len, width]) and the position of its first row
  // in the whole sequence. A query piece's rows are q|k|v (width W, the qkv layout); a
  // key/value piece's are k|v alone (width Wkv = 2 Ckv: k's heads, then v's), which is
  // what the ring sends.
  struct SeqPiece {
    const Act* rows;
    int first;
    int len;
  };
  // One step of the ring: the queries of piece q against the keys and values of piece
  // kv, causal by position in the whole sequence, in the blocked (fused) form.
  // Forward: merges into out [B,q.len,C] and the state of q's rows (as
  // attention_state_bytes(B, q.len, NH) gives), or with `write` overwrites them (for a
  // kv piece where every row of q sees a key: its own piece). Backward, from the final
  // out and state: adds to the q part of dq [B,q.len,W] and to dkv [B,kv.len,Wkv]. A
  // backend without them throws std::logic_error.
  virtual void ring_attention_forward_step(Act* out, void* state, SeqPiece q, SeqPiece kv, int B,
                                           int C, int NH, int NKV, bool write);
  virtual void ring_attention_backward_step(Act* dq, Act* dkv, const Act* dout, const Act* out,
                                            const void* state, SeqPiece q, SeqPiece kv, int B,
                                            int C, int NH, int NKV);

  // ---- Embedding and loss ----
  // Vocab-parallel embedding: wte holds the rows [vocab_begin, vocab_begin+vocab_rows)
  // of the token table. out[b,t,:] = wte[tokens[b,t]-vocab_begin,:] for tokens in that
  // range, 0 for others; plus wpe[t,:] when wpe is not null.
  virtual void embedding_forward(Act* out, const int32_t* tokens, const Act* wte,
                                 int vocab_begin, int vocab_rows, const Act* wpe, int B, int T,
                                 int C) = 0;
  // dwte[tokens[b,t]-vocab_begin,:] += dout[b,t,:] for tokens in range;
  // dwpe[t,:] += dout[b,t,:] when dwpe is not null.
  virtual void embedding_backward(float* dwte, float* dwpe, const Act* dout,
                                  const int32_t* tokens, int vocab_begin, int vocab_rows, int B,
                                  int T, int C) = 0;
  // Softmax cross-entropy over the first V of Vp columns of logits[N,Vp] (the padded
  // columns are masked out). losses[n] = -log p[n, targets[n]];
  // dlogits[n,:] = dloss * (p[n,:] - onehot(targets[n])), 0 on padded columns.
  // dlogits may alias logits. dlogits == nullptr computes the loss only.
  virtual void cross_entropy(float* losses, Act* dlogits, const Act* logits,
                             const int32_t* targets, int N, int V, int Vp, float dloss) = 0;
  // Vocab-parallel cross-entropy in three phases, for logits[N,Vl] that hold the
  // columns [col_begin, col_begin+Vl) of the padded vocabulary (global columns >= V are
  // padding). Between phases the caller all-reduces over the tensor-parallel group:
  // rowmax with MAX after phase 1, stats with SUM after phase 2.
  // 1. rowmax[n] = max over this shard's real columns (-inf when it has none); stats
  //    [2n, 2n+2) get what phase 2 needs of the row (the backend's own: the CUDA kernels
  //    sum the row's exponentials here, in the same pass).
  virtual void ce_row_max(float* rowmax, float* stats, const Act* logits, int N, int Vl,
                          int col_begin, int V) = 0;
  // 2. With rowmax now the max over all shards and stats as phase 1 left them:
  //    stats[2n] = sum over real columns of exp(logit - rowmax[n]); stats[2n+1] = the
  //    target's logit when its column is in this shard, else 0.
  virtual void ce_partial_sums(float* stats, const Act* logits, const float* rowmax,
                               const int32_t* targets, int N, int Vl, int col_begin, int V) = 0;
  // 3. losses[n] = log(stats[2n]) + rowmax[n] - stats[2n+1]; when dlogits is not null
  //    (it may alias logits) dlogits = dloss * (p - onehot(target)), 0 on padding.
  virtual void ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                         const float* stats, const int32_t* targets, int N, int Vl, int col_begin,
                         int V, float dloss) = 0;

  // ---- Elementwise ----
  // out = a + b (out may alias a or b).
  virtual void add(Act* out, const Act* a, const Act* b, std::size_t n) = 0;
};

// Backend memory that could not be had: how much, what for (when the caller said), and
// what the backend held then.
class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(std::size_t bytes, std::size_t held, const std::string& backend,
              const std::string& purpose = "");
  // The same failure, saying what the memory was for.
  OutOfMemory named(const std::string& purpose) const {
    return OutOfMemory(bytes, held, backend, purpose);
  }
  std::size_t bytes, held;
  std::string backend;
};

// Move-only owner of `bytes` of one backend's memory (256-byte aligned). `purpose`, when
// given, names it in an OutOfMemory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Ops& ops, std::size_t bytes, const char* purpose = nullptr)
      : ops_(&ops), data_(take(ops, bytes, false, purpose)), bytes_(bytes) {}
  // All zero (Ops::allocate_zeroed).
  static Buffer zeroed(Ops& ops, std::size_t bytes, const char* purpose = nullptr) {
    return Buffer(ops, bytes, true, purpose);
  }
  Buffer(Buffer&& o) noexcept
      : ops_(o.ops_), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      ops_ = o.ops_;
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  void* get() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Act* act() const { return static_cast<Act*>(data_); }
  float* f32() const { return static_cast<float*>(data_); }
  int32_t* i32() const { return static_cast<int32_t*>(data_); }
  void zero() {
    if (data_) ops_->fill_zero(data_, bytes_);
  }

 private:
  Buffer(Ops& ops, std::size_t bytes, bool zeroed, const char* purpose)
      : ops_(&ops), data_(take(ops, bytes, zeroed, purpose)), bytes_(bytes) {}
  static void* take(Ops& ops, std::size_t bytes, bool zeroed, const char* purpose) {
    if (bytes == 0) return nullptr;
    try {
      return zeroed ? ops.allocate_zeroed(bytes) : ops.allocate(bytes);
    } catch (const OutOfMemory& e) {
      if (purpose) throw e.named(purpose);
      throw;
    }
  }
  void release() noexcept {
    if (data_) ops_->deallocate(data_);
    data_ = nullptr;
  }
  Ops* ops_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Bytes of the state attention saves for [B, NH, T] query rows: one fp32 log-sum-exp per
// row (the blocked and flash-style kernels) or each row's T probabilities in `dtype`.
inline std::size_t attention_state_bytes(bool saves_logsumexp, DType dtype, int B, int T, int NH) {
  const std::size_t rows = std::size_t(B) * std::size_t(NH) * std::size_t(T);
  return saves_logsumexp ? rows * sizeof(float) : rows * std::size_t(T) * dtype_size(dtype);
}

// ---- What the CUDA backend holds besides the arrays it is asked for. The backend asks
// for exactly these; the memory plan adds them up. ----
// cuBLASLt's workspace, allocated with the backend.
inline constexpr std::size_t kCudaGemmWorkspaceBytes = std::size_t(32) << 20;
// The column sums (bias and norm weight gradients) sum chunks of this many rows; one sum
// of [N, C] needs a float of scratch per chunk and column.
inline constexpr int kCudaColumnSumRows = 64;
inline std::size_t cuda_column_sum_floats(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return std::size_t((N + kCudaColumnSumRows - 1) / kCudaColumnSumRows) * std::size_t(C);
}
// The embedding table gradient's scratch: for each vocabulary row a rank holds, a bit per
// tile of kCudaEmbeddingTile positions, set where the tile holds that row's token (32
// tiles a word), so that the gradient's blocks read only the tiles of their rows.
inline constexpr int kCudaEmbeddingTile = 256;
inline std::size_t cuda_embedding_tile_words(int positions) {
  const int tiles = (positions + kCudaEmbeddingTile - 1) / kCudaEmbeddingTile;
  return std::size_t((tiles + 31) / 32);
}
inline std::size_t cuda_embedding_scratch_bytes(int vocab_rows, int positions) {
  return std::size_t(vocab_rows > 0 ? vocab_rows : 0) * cuda_embedding_tile_words(positions) * 4;
}
// sum_squares_to's partial sums (one double each), before one result slot per span.
inline constexpr int kCudaSumSquaresPartials = 1024;
// The head sizes the fused attention kernels take (given the shared memory they need).
inline bool cuda_fused_attention_head_size(int hs) { return hs % 16 == 0 && hs >= 16 && hs <= 128; }
// Scratch of the CUDA attention's forward or backward over B x T rows of NH query heads
// of hs: with the fused kernels (`fused`), the backward's row dots; else the heads split
// into [B*NH, T, hs] arrays, k and v repeated for each query head of a group (q, k, v,
// y; the backward also dy, dq, dk, dv and the score gradients [B*NH, T, T]), plus the
// probabilities when they are not the saved state (`probabilities_in_scratch`: fused
// asked for, but not for this head size).
inline std::size_t cuda_attention_scratch_bytes(bool backward, bool fused,
                                                bool probabilities_in_scratch, DType dtype,
                                                int B, int T, int NH, int hs) {
  const std::size_t rows = std::size_t(B) * std::size_t(NH) * std::size_t(T);
  if (fused) return backward ? (rows * sizeof(float) + 255) / 256 * 256 : 0;
  const std::size_t n = rows * std::size_t(hs), tt = rows * std::size_t(T);
  const std::size_t probs = probabilities_in_scratch ? tt : 0;
  return (backward ? 7 * n + tt + probs : 4 * n + probs) * dtype_size(dtype);
}

// The fp32 CPU reference backend; GEMMs through OpenBLAS with `threads` threads
// (0: all cores).
// blocked_attention: causal attention in blocks (train.attention: fused), which saves
// each row's log-sum-exp instead of the [B,NH,T,T] probabilities.
std::unique_ptr<Ops> make_cpu_ops(int threads = 0, bool blocked_attention = false);

// True when this build has the CUDA backend; the number of visible CUDA devices (0 when
// none, no driver, or no CUDA backend).
bool cuda_backend_built();
int cuda_device_count();
// CUDA device `device`'s name and memory, read without creating a context on it.
struct CudaDeviceInfo {
  std::string name;
  std::size_t total_bytes = 0;
};
CudaDeviceInfo cuda_device_info(int device);
// The CUDA backend on device `device` with activations and weight copy in `compute`
// (BF16 or F32). flash_attention: fused attention kernels (used in bf16 only; their
// state is smaller). Throws std::runtime_error when this build has no CUDA backend.
std::unique_ptr<Ops> make_cuda_ops(int device, DType compute, bool flash_attention = false);

}  // namespace pptrain::ops
