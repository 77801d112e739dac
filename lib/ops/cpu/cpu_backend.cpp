// CPU backend: the ops::Ops entry points that are not a plain fp32 op (those come from
// Fp32Forwarding, cpu_ops.hpp): the memory functions (host memory), the precision
// conversions (Act arrays are fp32), AdamW, the squared-norm sums and the choice of
// attention kernel.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "ops/cpu/blas_kernels.hpp"
#include "ops/cpu/cpu_math.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

namespace {
float* f(Act* p) { return reinterpret_cast<float*>(p); }
const float* f(const Act* p) { return reinterpret_cast<const float*>(p); }
}  // namespace

std::string CpuOps::name() const {
  return std::string("cpu (fp32, GEMM ") + cpu::gemm_kernel_name(gemm_kernel_) + ", OpenBLAS " +
         blas_coretype() + ", " +
         (threads_ > 0 ? std::to_string(threads_) : std::string("all")) +
         " threads)";
}

void* CpuOps::allocate(std::size_t bytes) {
  const std::size_t rounded = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  void* p = std::aligned_alloc(kArenaAlignment, rounded ? rounded : kArenaAlignment);
  if (!p) throw OutOfMemory(bytes, memory_.held(), name());
  memory_.added(p, bytes);
  return p;
}
// Large zeroed arenas (parameters, gradients, optimizer moments: 2 GB at GPT-2 124M) are
// mapped on transparent huge pages where the system allows (MADV_HUGEPAGE), then touched
// by every thread (fill_zero). Measured at 124M on 2 cores: launch to the end of step 2 in
// 6.4 s, against 7.6 s with 4 KiB pages; leaving the pages to fault in during step 1
// instead made that step 2.7 s slower (docs/design.md).
constexpr std::size_t kMappedMinBytes = std::size_t(1) << 22;

void* CpuOps::allocate_zeroed(std::size_t bytes) {
  if (bytes < kMappedMinBytes) {
    void* p = allocate(bytes);
    fill_zero(p, bytes);
    return p;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw OutOfMemory(bytes, memory_.held(), name());
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
  fill_zero(p, bytes);
  mapped_[p] = bytes;
  memory_.added(p, bytes);
  return p;
}
void CpuOps::deallocate(void* p) noexcept {
  memory_.removed(p);
  if (auto it = mapped_.find(p); it != mapped_.end()) {
    munmap(p, it->second);
    mapped_.erase(it);
    return;
  }
  std::free(p);
}
namespace {
// Large fills and copies in one block per OpenMP thread: on a fresh allocation this
// also spreads the kernel's page zeroing (first touch) over the cores.
constexpr std::size_t kParallelBytes = std::size_t(1) << 22;

template <typename F>
void in_blocks(std::size_t bytes, F f) {
  if (bytes < kParallelBytes) return f(std::size_t(0), bytes);
  const std::ptrdiff_t blocks = static_cast<std::ptrdiff_t>((bytes + kParallelBytes - 1) / kParallelBytes);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t b = 0; b < blocks; ++b) {
    const std::size_t begin = std::size_t(b) * kParallelBytes;
    f(begin, std::min(kParallelBytes, bytes - begin));
  }
}
}  // namespace

void CpuOps::upload(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
void CpuOps::download(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
void CpuOps::copy(void* dst, const void* src, std::size_t bytes) {
  if (!bytes || dst == src) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const bool overlap = d < s + bytes && s < d + bytes;
  if (overlap) return void(std::memmove(dst, src, bytes));
  in_blocks(bytes, [&](std::size_t begin, std::size_t n) { std::memcpy(d + begin, s + begin, n); });
}

void CpuOps::copy_columns(float* dst, int dst_width, int dst_col, const float* src, int src_width,
                          int src_col, int rows, int cols) {
  PPTRAIN_CHECK(rows >= 0 && cols >= 0 && dst_col >= 0 && src_col >= 0 &&
                    dst_col + cols <= dst_width && src_col + cols <= src_width,
                "copy_columns: columns outside the rows");
  for (int r = 0; r < rows; ++r)
    std::copy_n(src + std::size_t(r) * src_width + src_col, cols,
                dst + std::size_t(r) * dst_width + dst_col);
}
void CpuOps::fill_zero(void* dst, std::size_t bytes) {
  auto* d = static_cast<char*>(dst);
  in_blocks(bytes, [&](std::size_t begin, std::size_t n) { std::memset(d + begin, 0, n); });
}
void CpuOps::to_compute(Act* dst, const float* src, std::size_t n) { copy(dst, src, n * 4); }
void CpuOps::to_float(float* dst, const Act* src, std::size_t n) { copy(dst, src, n * 4); }

double CpuOps::sum_squares(const std::vector<Span>& spans) {
  // Each span in chunks of kChunk elements, each chunk with eight interleaved partial
  // sums (so the fp64 adds form no long dependency chain); the chunks are summed in
  // order. A fixed pattern: the result does not depend on the thread count.
  constexpr std::size_t kLanes = 8, kChunk = std::size_t(1) << 16;
  double total = 0.0;
  for (const Span& s : spans) {
    const std::ptrdiff_t chunks = static_cast<std::ptrdiff_t>((s.n + kChunk - 1) / kChunk);
    double* part = double_scratch(static_cast<std::size_t>(chunks));
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (std::ptrdiff_t c = 0; c < chunks; ++c) {
      const float* g = s.data + static_cast<std::size_t>(c) * kChunk;
      const std::size_t n = std::min(kChunk, s.n - static_cast<std::size_t>(c) * kChunk);
      double lane[kLanes] = {};
      std::size_t i = 0;
      for (; i + kLanes <= n; i += kLanes)
        for (std::size_t k = 0; k < kLanes; ++k) lane[k] += double(g[i + k]) * double(g[i + k]);
      for (std::size_t k = 0; i < n; ++i, ++k) lane[k] += double(g[i]) * double(g[i]);
      double sum = 0.0;
      for (double l : lane) sum += l;
      part[c] = sum;
    }
    for (std::ptrdiff_t c = 0; c < chunks; ++c) total += part[c];
  }
  return total;
}

void CpuOps::add_mean(double* total, const float* x, std::size_t n) {
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += x[i];
  *total += double(float(sum / double(n)));
}

void CpuOps::update_control(float* control, const double* stats, double grad_clip) {
  const double norm = std::sqrt(stats[1]);
  control[0] = grad_clip > 0.0 && norm > grad_clip ? float(grad_clip / (norm + 1e-6)) : 1.0f;
  control[1] = std::isfinite(stats[0]) && std::isfinite(norm) ? 1.0f : 0.0f;
}

std::vector<double> CpuOps::take_marks() {
  std::vector<double> s;
  for (const auto& t : marks_) s.push_back(std::chrono::duration<double>(t - marks_[0]).count());
  marks_.clear();
  return s;
}

void CpuOps::adamw(float* params, Act* weights, const float* grads, float* exp_avg,
                   float* exp_avg_sq, std::size_t n, const AdamWStep& h) {
  // The step's constants in locals and the arrays marked unaliased, so the loop
  // vectorises without reloading them per element.
  if (h.control && h.control[1] == 0.0f) return;
  const float beta1 = h.beta1, beta2 = h.beta2, one_minus_b1 = h.one_minus_beta1,
              one_minus_b2 = h.one_minus_beta2,
              grad_scale = h.control ? h.control[0] : h.grad_scale, lr = h.lr, eps = h.eps,
              weight_decay = h.weight_decay, bc1 = h.inv_bias_correction1,
              bc2 = h.inv_bias_correction2;
  float* __restrict p = params;
  float* __restrict m = exp_avg;
  float* __restrict v = exp_avg_sq;
  const float* __restrict g_in = grads;
  const std::ptrdiff_t count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static) if (count > cpu::kParallelMin)
  for (std::ptrdiff_t i = 0; i < count; ++i) {
    const float g = g_in[i] * grad_scale;
    m[i] = beta1 * m[i] + one_minus_b1 * g;
    v[i] = beta2 * v[i] + one_minus_b2 * (g * g);
    const float m_hat = m[i] * bc1;
    const float v_hat = v[i] * bc2;
    p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * p[i]);
  }
  if (weights && f(weights) != params) copy(weights, params, n * 4);
}

std::size_t CpuOps::attention_state_bytes(int B, int T, int NH) const {
  return ops::attention_state_bytes(blocked_attention_, DType::F32, B, T, NH);
}
void CpuOps::attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C, int NH,
                               int NKV) {
  if (blocked_attention_)
    return attention_forward_blocked(f(out), static_cast<float*>(state), f(qkv), B, T, C, NH, NKV);
  attention_forward(f(out), static_cast<float*>(state), f(qkv), B, T, C, NH, NKV);
}
// The saved probabilities suffice for the unblocked form; the blocked one needs `out`.
void CpuOps::attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                                const void* state, int B, int T, int C, int NH, int NKV) {
  if (blocked_attention_)
    return attention_backward_blocked(f(dqkv), f(dout), f(qkv), f(out),
                                      static_cast<const float*>(state), B, T, C, NH, NKV);
  attention_backward(f(dqkv), f(dout), f(qkv), static_cast<const float*>(state), B, T, C, NH,
                     NKV);
}

void CpuOps::linear_forward(Act* out, Act* gelu_out, const Act* inp, const Act* w, const Act* bias,
                            int N, int Cin, int Cout) {
  linear_forward(f(out), f(gelu_out), f(inp), f(w), f(bias), N, Cin, Cout);
}

void CpuOps::linear_backward_input(Act* dinp, const Act* dout, const Act* w, const Act* gelu_inp,
                                   int N, int Cin, int Cout) {
  linear_backward_input(f(dinp), f(dout), f(w), f(gelu_inp), N, Cin, Cout);
}

}  // namespace pptrain::ops
