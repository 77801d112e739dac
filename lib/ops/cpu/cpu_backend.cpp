// CPU backend: the ops::Ops entry points that are not a plain fp32 op (those come from
// Fp32Forwarding, cpu_ops.hpp): the memory functions (host memory), the precision
// conversions (Act arrays are fp32), AdamW, the squared-norm sums and the choice of
// attention kernel.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include <omp.h>

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

// Large blocks (activations; parameters, gradients and optimizer moments, 2 GB at GPT-2
// 124M) are mapped on transparent huge pages where the system allows (MADV_HUGEPAGE):
// the products read activations a row per page in places (a weight gradient's operands
// are its tokens' rows), where 4 KiB pages cost a TLB miss a row. Zeroed arenas are then
// touched by every thread (fill_zero). Measured at 124M on 2 cores: launch to the end of
// step 2 in 6.4 s, against 7.6 s with 4 KiB pages; leaving the pages to fault in during
// step 1 instead made that step 2.7 s slower (docs/design.md).
constexpr std::size_t kMappedMinBytes = std::size_t(1) << 22;

void* CpuOps::allocate(std::size_t bytes) {
  if (bytes >= kMappedMinBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw OutOfMemory(bytes, memory_.held(), name());
    madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
    mapped_[p] = bytes;
    memory_.added(p, bytes);
    return p;
  }
  const std::size_t rounded = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  void* p = std::aligned_alloc(kArenaAlignment, rounded ? rounded : kArenaAlignment);
  if (!p) throw OutOfMemory(bytes, memory_.held(), name());
  memory_.added(p, bytes);
  return p;
}

void* CpuOps::allocate_zeroed(std::size_t bytes) {
  void* p = allocate(bytes);
  fill_zero(p, bytes);
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
  // sums (so the fp64 adds form no long dependency chain); the chunks of all spans are
  // summed in one parallel pass, then added in order. A fixed pattern: the result does
  // not depend on the thread count.
  constexpr std::size_t kLanes = 8, kChunk = std::size_t(1) << 16;
  struct Chunk {
    const float* data;
    std::size_t n;
  };
  std::vector<Chunk> chunks;
  for (const Span& s : spans)
    for (std::size_t at = 0; at < s.n; at += kChunk)
      chunks.push_back({s.data + at, std::min(kChunk, s.n - at)});
  const std::ptrdiff_t count = static_cast<std::ptrdiff_t>(chunks.size());
  double* part = double_scratch(chunks.size());
#pragma omp parallel for schedule(static) if (count > 1)
  for (std::ptrdiff_t c = 0; c < count; ++c) {
    const float* g = chunks[std::size_t(c)].data;
    const std::size_t n = chunks[std::size_t(c)].n;
    double lane[kLanes] = {};
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (std::size_t k = 0; k < kLanes; ++k) lane[k] += double(g[i + k]) * double(g[i + k]);
    for (std::size_t k = 0; i < n; ++i, ++k) lane[k] += double(g[i]) * double(g[i]);
    double sum = 0.0;
    for (double l : lane) sum += l;
    part[c] = sum;
  }
  double total = 0.0;
  for (std::ptrdiff_t c = 0; c < count; ++c) total += part[c];
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

namespace {
// AdamW on n elements, the step's constants in locals and the arrays marked unaliased,
// so the loop vectorises without reloading them per element.
void adamw_run(float* __restrict p, const float* __restrict g_in, float* __restrict m,
               float* __restrict v, std::size_t n, const AdamWStep& h, float grad_scale,
               float weight_decay) {
  const float beta1 = h.beta1, beta2 = h.beta2, one_minus_b1 = h.one_minus_beta1,
              one_minus_b2 = h.one_minus_beta2, lr = h.lr, eps = h.eps,
              bc1 = h.inv_bias_correction1, bc2 = h.inv_bias_correction2;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = g_in[i] * grad_scale;
    m[i] = beta1 * m[i] + one_minus_b1 * g;
    v[i] = beta2 * v[i] + one_minus_b2 * (g * g);
    const float m_hat = m[i] * bc1;
    const float v_hat = v[i] * bc2;
    p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * p[i]);
  }
}
}  // namespace

void CpuOps::adamw_segments(float* params, Act* weights, const float* grads, float* exp_avg,
                            float* exp_avg_sq, const std::vector<AdamWSegment>& segments,
                            const AdamWStep& step) {
  if (step.control && step.control[1] == 0.0f) return;
  AdamWStep h = step;
  if (step.schedule) {
    h.lr = step.schedule[0];
    h.inv_bias_correction1 = step.schedule[1];
    h.inv_bias_correction2 = step.schedule[2];
  }
  const float grad_scale = h.control ? h.control[0] : h.grad_scale;
  std::vector<std::size_t> first{0};  // where each segment starts among all the elements
  for (const AdamWSegment& s : segments) first.push_back(first.back() + s.n);
  const std::size_t total = first.back();
  // One parallel region: thread k of t takes elements [k total / t, (k+1) total / t) of
  // the segments laid end to end, a piece of each segment it meets.
#pragma omp parallel if (total > std::size_t(cpu::kParallelMin))
  {
    const std::size_t t = std::size_t(omp_get_num_threads()), k = std::size_t(omp_get_thread_num());
    const std::size_t lo = total * k / t, hi = total * (k + 1) / t;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const std::size_t b = std::max(lo, first[i]), e = std::min(hi, first[i + 1]);
      if (b >= e) continue;
      const AdamWSegment& s = segments[i];
      const std::size_t at = b - first[i];
      adamw_run(params + s.param + at, grads + s.arena + at, exp_avg + s.state + at,
                exp_avg_sq + s.state + at, e - b, h, grad_scale, s.weight_decay);
    }
  }
  if (!weights) return;
  for (const AdamWSegment& s : segments)
    if (f(weights) + s.arena != params + s.param)
      copy(f(weights) + s.arena, params + s.param, s.n * 4);
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

void CpuOps::gemm_residual(bool trans_b, int M, int N, int K, const Act* A, const Act* B,
                           const Act* bias, const Act* R, Act* D) {
  gemm_residual(trans_b, M, N, K, f(A), f(B), f(bias), f(R), f(D));
}

void CpuOps::linear_backward_input(Act* dinp, const Act* dout, const Act* w, const Act* gelu_inp,
                                   int N, int Cin, int Cout) {
  linear_backward_input(f(dinp), f(dout), f(w), f(gelu_inp), N, Cin, Cout);
}

}  // namespace pptrain::ops
