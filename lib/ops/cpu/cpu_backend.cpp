// CPU backend: the ops::Ops entry points. Memory is host memory and Act arrays are
// fp32, so each op forwards to its fp32-array implementation; plus the memory
// functions, AdamW and the squared-norm sums.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

namespace {
float* f(Act* p) { return reinterpret_cast<float*>(p); }
const float* f(const Act* p) { return reinterpret_cast<const float*>(p); }
}  // namespace

std::string CpuOps::name() const {
  return "cpu (fp32, OpenBLAS, " + (threads_ > 0 ? std::to_string(threads_) : std::string("all")) +
         " threads)";
}

void* CpuOps::allocate(std::size_t bytes) {
  const std::size_t rounded = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  void* p = std::aligned_alloc(kArenaAlignment, rounded ? rounded : kArenaAlignment);
  if (!p) throw std::bad_alloc();
  return p;
}
void CpuOps::deallocate(void* p) noexcept { std::free(p); }
void CpuOps::upload(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuOps::download(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuOps::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}
void CpuOps::fill_zero(void* dst, std::size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}
void CpuOps::to_compute(Act* dst, const float* src, std::size_t n) { copy(dst, src, n * 4); }
void CpuOps::to_float(float* dst, const Act* src, std::size_t n) { copy(dst, src, n * 4); }

double CpuOps::sum_squares(const std::vector<Span>& spans) {
  // Eight interleaved partial sums per span (a fixed pattern, so still deterministic)
  // keep the fp64 adds from forming one long dependency chain.
  constexpr std::size_t kLanes = 8;
  double total = 0.0;
  for (const Span& s : spans) {
    const float* g = s.data;
    double part[kLanes] = {};
    std::size_t i = 0;
    for (; i + kLanes <= s.n; i += kLanes)
      for (std::size_t k = 0; k < kLanes; ++k) part[k] += double(g[i + k]) * double(g[i + k]);
    for (std::size_t k = 0; i < s.n; ++i, ++k) part[k] += double(g[i]) * double(g[i]);
    double sum = 0.0;
    for (double p : part) sum += p;
    total += sum;
  }
  return total;
}

void CpuOps::adamw(float* p, Act* weights, const float* grads, float* m, float* v, std::size_t n,
                   const AdamWStep& h) {
  const float one_minus_b1 = 1.0f - h.beta1, one_minus_b2 = 1.0f - h.beta2;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = grads[i] * h.grad_scale;
    m[i] = h.beta1 * m[i] + one_minus_b1 * g;
    v[i] = h.beta2 * v[i] + one_minus_b2 * (g * g);
    const float m_hat = m[i] * h.inv_bias_correction1;
    const float v_hat = v[i] * h.inv_bias_correction2;
    p[i] -= h.lr * (m_hat / (std::sqrt(v_hat) + h.eps) + h.weight_decay * p[i]);
  }
  if (weights && f(weights) != p) copy(weights, p, n * 4);
}

void CpuOps::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const Act* A, const Act* B,
                  float beta, Act* C) {
  gemm(ta, tb, M, N, K, alpha, f(A), f(B), beta, f(C));
}
void CpuOps::linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                                int Cout) {
  gemm(true, false, Cin, Cout, N, 1.0f, f(inp), f(dout), 1.0f, dw);
}
void CpuOps::add_bias(Act* out, const Act* bias, int N, int C) { add_bias(f(out), f(bias), N, C); }
void CpuOps::bias_backward(float* dbias, const Act* dout, int N, int C) {
  bias_backward(dbias, f(dout), N, C);
}
void CpuOps::layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w,
                               const Act* b, int N, int C) {
  layernorm_forward(f(out), mean, rstd, f(inp), f(w), f(b), N, C);
}
void CpuOps::layernorm_backward_input(Act* dinp, const Act* dout, const Act* inp, const Act* w,
                                      const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_input(f(dinp), f(dout), f(inp), f(w), mean, rstd, N, C);
}
void CpuOps::layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                       const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_weight(dw, db, f(dout), f(inp), mean, rstd, N, C);
}
void CpuOps::gelu_forward(Act* out, const Act* inp, std::size_t n) { gelu_forward(f(out), f(inp), n); }
void CpuOps::gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) {
  gelu_backward(f(dinp), f(inp), f(dout), n);
}
std::size_t CpuOps::attention_state_bytes(int B, int T, int NH) const {
  return std::size_t(B) * std::size_t(NH) * std::size_t(T) * std::size_t(T) * sizeof(float);
}
void CpuOps::attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C, int NH) {
  attention_forward(f(out), static_cast<float*>(state), f(qkv), B, T, C, NH);
}
// The saved probabilities suffice; `out` is not needed.
void CpuOps::attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* /*out*/,
                                const void* state, int B, int T, int C, int NH) {
  attention_backward(f(dqkv), f(dout), f(qkv), static_cast<const float*>(state), B, T, C, NH);
}
void CpuOps::embedding_forward(Act* out, const int32_t* tokens, const Act* wte, int vocab_begin,
                               int vocab_rows, const Act* wpe, int B, int T, int C) {
  embedding_forward(f(out), tokens, f(wte), vocab_begin, vocab_rows, f(wpe), B, T, C);
}
void CpuOps::embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                                int vocab_begin, int vocab_rows, int B, int T, int C) {
  embedding_backward(dwte, dwpe, f(dout), tokens, vocab_begin, vocab_rows, B, T, C);
}
void CpuOps::cross_entropy(float* losses, Act* dlogits, const Act* logits, const int32_t* targets,
                           int N, int V, int Vp, float dloss) {
  cross_entropy(losses, f(dlogits), f(logits), targets, N, V, Vp, dloss);
}
void CpuOps::ce_row_max(float* rowmax, const Act* logits, int N, int Vl, int col_begin, int V) {
  ce_row_max(rowmax, f(logits), N, Vl, col_begin, V);
}
void CpuOps::ce_partial_sums(float* stats, const Act* logits, const float* rowmax,
                             const int32_t* targets, int N, int Vl, int col_begin, int V) {
  ce_partial_sums(stats, f(logits), rowmax, targets, N, Vl, col_begin, V);
}
void CpuOps::ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                       const float* stats, const int32_t* targets, int N, int Vl, int col_begin,
                       int V, float dloss) {
  ce_finish(losses, f(dlogits), f(logits), rowmax, stats, targets, N, Vl, col_begin, V, dloss);
}
void CpuOps::add(Act* out, const Act* a, const Act* b, std::size_t n) { add(f(out), f(a), f(b), n); }

}  // namespace pptrain::ops
