// The bf16-storage CPU test backend (see bf16_cpu_ops.hpp).
#include "bf16_cpu_ops.hpp"

#include <cmath>
#include <cstring>

namespace pptrain::test_support {

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return uint16_t((u >> 16) | 0x40);  // keep it a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);                          // round to nearest even
  return uint16_t(u >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

namespace {

using ops::Act;
using ops::CpuOps;

// fp32 copy of an Act array of n elements, and the write-back.
std::vector<float> widen(const Act* p, std::size_t n) {
  std::vector<float> out(n);
  const auto* b = reinterpret_cast<const uint16_t*>(p);
  for (std::size_t i = 0; i < n; ++i) out[i] = from_bf16(b[i]);
  return out;
}
void narrow(Act* p, const std::vector<float>& v) {
  auto* b = reinterpret_cast<uint16_t*>(p);
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = to_bf16(v[i]);
}
std::size_t sz(long a, long b = 1, long c = 1, long d = 1) { return std::size_t(a * b * c * d); }

class Bf16CpuOps final : public ops::Ops {
 public:
  std::string name() const override { return "cpu (bf16 storage, test backend)"; }
  DType compute_dtype() const override { return DType::BF16; }
  bool device_memory() const override { return false; }
  void* allocate(std::size_t bytes) override { return cpu_.allocate(bytes); }
  void deallocate(void* p) noexcept override { cpu_.deallocate(p); }
  void upload(void* d, const void* s, std::size_t n) override { cpu_.upload(d, s, n); }
  void download(void* d, const void* s, std::size_t n) override { cpu_.download(d, s, n); }
  void copy(void* d, const void* s, std::size_t n) override { cpu_.copy(d, s, n); }
  void fill_zero(void* d, std::size_t n) override { cpu_.fill_zero(d, n); }
  void synchronize() override {}

  void to_compute(Act* dst, const float* src, std::size_t n) override {
    narrow(dst, std::vector<float>(src, src + n));
  }
  void to_float(float* dst, const Act* src, std::size_t n) override {
    const auto v = widen(src, n);
    std::memcpy(dst, v.data(), n * 4);
  }
  double sum_squares(const std::vector<ops::Span>& spans) override { return cpu_.sum_squares(spans); }
  void adamw(float* p, Act* weights, const float* g, float* m, float* v, std::size_t n,
             const ops::AdamWStep& h) override {
    cpu_.adamw(p, nullptr, g, m, v, n, h);
    if (weights) to_compute(weights, p, n);
  }

  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const Act* A, const Act* B,
            float beta, Act* C) override {
    auto a = widen(A, sz(M, K)), b = widen(B, sz(K, N)), c = widen(C, sz(M, N));
    if (beta == 0.0f) c.assign(c.size(), 0.0f);  // C may hold garbage
    cpu_.gemm(ta, tb, M, N, K, alpha, a.data(), b.data(), beta, c.data());
    narrow(C, c);
  }
  void linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                          int Cout) override {
    auto x = widen(inp, sz(N, Cin)), dy = widen(dout, sz(N, Cout));
    cpu_.gemm(true, false, Cin, Cout, N, 1.0f, x.data(), dy.data(), 1.0f, dw);
  }
  void add_bias(Act* out, const Act* bias, int N, int C) override {
    auto o = widen(out, sz(N, C)), b = widen(bias, sz(C));
    cpu_.add_bias(o.data(), b.data(), N, C);
    narrow(out, o);
  }
  void bias_backward(float* db, const Act* dout, int N, int C) override {
    cpu_.bias_backward(db, widen(dout, sz(N, C)).data(), N, C);
  }
  void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w,
                         const Act* b, int N, int C) override {
    std::vector<float> o(sz(N, C));
    cpu_.layernorm_forward(o.data(), mean, rstd, widen(inp, sz(N, C)).data(), widen(w, sz(C)).data(),
                           widen(b, sz(C)).data(), N, C);
    narrow(out, o);
  }
  void layernorm_backward_input(Act* dinp, const Act* dout, const Act* inp, const Act* w,
                                const float* mean, const float* rstd, int N, int C) override {
    auto d = widen(dinp, sz(N, C));
    cpu_.layernorm_backward_input(d.data(), widen(dout, sz(N, C)).data(),
                                  widen(inp, sz(N, C)).data(), widen(w, sz(C)).data(), mean, rstd,
                                  N, C);
    narrow(dinp, d);
  }
  void layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                 const float* mean, const float* rstd, int N, int C) override {
    cpu_.layernorm_backward_weight(dw, db, widen(dout, sz(N, C)).data(),
                                   widen(inp, sz(N, C)).data(), mean, rstd, N, C);
  }
  void gelu_forward(Act* out, const Act* inp, std::size_t n) override {
    std::vector<float> o(n);
    cpu_.gelu_forward(o.data(), widen(inp, n).data(), n);
    narrow(out, o);
  }
  void gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) override {
    std::vector<float> d(n);
    cpu_.gelu_backward(d.data(), widen(inp, n).data(), widen(dout, n).data(), n);
    narrow(dinp, d);
  }
  std::size_t attention_state_bytes(int B, int T, int NH) const override {
    return cpu_.attention_state_bytes(B, T, NH);  // fp32 probabilities
  }
  void attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C,
                         int NH) override {
    std::vector<float> o(sz(B, T, C));
    cpu_.attention_forward(o.data(), static_cast<float*>(state), widen(qkv, sz(B, T, 3 * C)).data(),
                           B, T, C, NH);
    narrow(out, o);
  }
  void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* /*out*/,
                          const void* state, int B, int T, int C, int NH) override {
    std::vector<float> d(sz(B, T, 3 * C));
    cpu_.attention_backward(d.data(), widen(dout, sz(B, T, C)).data(),
                            widen(qkv, sz(B, T, 3 * C)).data(), static_cast<const float*>(state), B,
                            T, C, NH);
    narrow(dqkv, d);
  }
  void embedding_forward(Act* out, const int32_t* tokens, const Act* wte, int vb, int rows,
                         const Act* wpe, int B, int T, int C) override {
    std::vector<float> o(sz(B, T, C));
    const auto pos = wpe ? widen(wpe, sz(T, C)) : std::vector<float>();
    cpu_.embedding_forward(o.data(), tokens, widen(wte, sz(rows, C)).data(), vb, rows,
                           wpe ? pos.data() : nullptr, B, T, C);
    narrow(out, o);
  }
  void embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                          int vb, int rows, int B, int T, int C) override {
    cpu_.embedding_backward(dwte, dwpe, widen(dout, sz(B, T, C)).data(), tokens, vb, rows, B, T, C);
  }
  void cross_entropy(float* losses, Act* dlogits, const Act* logits, const int32_t* targets, int N,
                     int V, int Vp, float dloss) override {
    auto l = widen(logits, sz(N, Vp));
    cpu_.cross_entropy(losses, dlogits ? l.data() : nullptr, l.data(), targets, N, V, Vp, dloss);
    if (dlogits) narrow(dlogits, l);
  }
  void ce_row_max(float* rowmax, const Act* logits, int N, int Vl, int cb, int V) override {
    cpu_.ce_row_max(rowmax, widen(logits, sz(N, Vl)).data(), N, Vl, cb, V);
  }
  void ce_partial_sums(float* stats, const Act* logits, const float* rowmax, const int32_t* targets,
                       int N, int Vl, int cb, int V) override {
    cpu_.ce_partial_sums(stats, widen(logits, sz(N, Vl)).data(), rowmax, targets, N, Vl, cb, V);
  }
  void ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                 const float* stats, const int32_t* targets, int N, int Vl, int cb, int V,
                 float dloss) override {
    auto l = widen(logits, sz(N, Vl));
    cpu_.ce_finish(losses, dlogits ? l.data() : nullptr, l.data(), rowmax, stats, targets, N, Vl, cb,
                   V, dloss);
    if (dlogits) narrow(dlogits, l);
  }
  void add(Act* out, const Act* a, const Act* b, std::size_t n) override {
    std::vector<float> o(n);
    cpu_.add(o.data(), widen(a, n).data(), widen(b, n).data(), n);
    narrow(out, o);
  }

 private:
  CpuOps cpu_{1};
};

}  // namespace

std::unique_ptr<ops::Ops> make_bf16_cpu_ops() { return std::make_unique<Bf16CpuOps>(); }

}  // namespace pptrain::test_support
