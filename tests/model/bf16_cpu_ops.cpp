// The CPU test backends with their own Act storage (see bf16_cpu_ops.hpp).
#include "bf16_cpu_ops.hpp"

#include <cmath>
#include <cstring>
#include <string>

namespace pptrain::test_support {

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return uint16_t((u >> 16) | 0x40);  // keep it a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);                         // round to nearest even
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

// fp32 copy of a bf16 Act array of n elements, and the write-back.
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

// How the CPU ops see bf16 Act arrays (see ops::Fp32Forwarding): inputs as widened
// copies; outputs in fp32 arrays (p's widened values when the op reads them, zeros
// otherwise) that store() rounds into p.
struct Bf16Arrays {
  static constexpr DType kDType = DType::BF16;
  static constexpr const char* kName = "cpu (bf16 storage, test backend)";
  class Input {
   public:
    Input(const Act* p, std::size_t n)
        : null_(!p), values_(p ? widen(p, n) : std::vector<float>()) {}
    const float* data() const { return null_ ? nullptr : values_.data(); }

   private:
    bool null_;
    std::vector<float> values_;
  };
  class Output {
   public:
    Output(Act* p, std::size_t n, bool reads)
        : p_(p), values_(p && reads ? widen(p, n) : std::vector<float>(p ? n : 0)) {}
    float* data() { return p_ ? values_.data() : nullptr; }
    void store() const {
      if (p_) narrow(p_, values_);
    }

   private:
    Act* p_;
    std::vector<float> values_;
  };
  static Input input(const Act* p, std::size_t n) { return {p, n}; }
  static Output output(Act* p, std::size_t n, bool reads) { return {p, n, reads}; }
};

// fp32 Act arrays, each output moved one ulp towards +inf once the op has written it.
struct OneUlpUpArrays {
  static constexpr DType kDType = DType::F32;
  static constexpr const char* kName = "cpu (fp32, outputs one ulp up, test backend)";
  using Input = ops::Fp32Arrays::Input;
  struct Output {
    Act* p;
    std::size_t n;
    float* data() const { return reinterpret_cast<float*>(p); }
    void store() const {
      for (std::size_t i = 0; p && i < n; ++i) data()[i] = std::nextafter(data()[i], INFINITY);
    }
  };
  static Input input(const Act* p, std::size_t /*n*/) { return {p}; }
  static Output output(Act* p, std::size_t n, bool /*reads*/) { return {p, n}; }
};

// The CPU reference's ops on Act arrays seen through Arrays; memory, precision
// conversions, the optimizer and attention forwarded here.
template <typename Arrays>
class StorageCpuOps final : public ops::Fp32Forwarding<StorageCpuOps<Arrays>, Arrays> {
 public:
  CpuOps& reference() { return cpu_; }
  std::string name() const override { return Arrays::kName; }
  DType compute_dtype() const override { return Arrays::kDType; }
  bool device_memory() const override { return false; }
  void* allocate(std::size_t bytes) override { return cpu_.allocate(bytes); }
  void deallocate(void* p) noexcept override { cpu_.deallocate(p); }
  void upload(void* d, const void* s, std::size_t n) override { cpu_.upload(d, s, n); }
  void download(void* d, const void* s, std::size_t n) override { cpu_.download(d, s, n); }
  void copy(void* d, const void* s, std::size_t n) override { cpu_.copy(d, s, n); }
  void fill_zero(void* d, std::size_t n) override { cpu_.fill_zero(d, n); }
  void synchronize() override {}

  void to_compute(Act* dst, const float* src, std::size_t n) override {
    typename Arrays::Output o = Arrays::output(dst, n, false);
    std::memcpy(o.data(), src, n * 4);
    o.store();
  }
  void to_float(float* dst, const Act* src, std::size_t n) override {
    std::memcpy(dst, Arrays::input(src, n).data(), n * 4);
  }
  double sum_squares(const std::vector<ops::Span>& spans) override {
    return cpu_.sum_squares(spans);
  }
  void sum_squares_to(double* out, const std::vector<ops::Span>& spans) override {
    cpu_.sum_squares_to(out, spans);
  }
  void add_mean(double* total, const float* x, std::size_t n) override { cpu_.add_mean(total, x, n); }
  void update_control(float* control, const double* stats, double clip) override {
    cpu_.update_control(control, stats, clip);
  }
  std::size_t mark() override { return cpu_.mark(); }
  std::vector<double> take_marks() override { return cpu_.take_marks(); }
  void adamw_segments(float* p, Act* weights, const float* g, float* m, float* v,
                      const std::vector<ops::AdamWSegment>& segments,
                      const ops::AdamWStep& h) override {
    cpu_.adamw_segments(p, nullptr, g, m, v, segments, h);
    const bool skipped = h.control && h.control[1] == 0.0f;
    if (weights && !skipped)
      for (const ops::AdamWSegment& s : segments)
        to_compute(ops::advance(weights, s.arena, compute_dtype()), p + s.param, s.n);
  }

  // The CPU's unblocked attention; its state is the fp32 probabilities.
  std::size_t attention_state_bytes(int B, int T, int NH) const override {
    return cpu_.attention_state_bytes(B, T, NH);
  }
  // qkv rows hold C query elements and 2 * C / NH * NKV key and value elements.
  void attention_forward(Act* out, void* state, const Act* qkv, int B, int T, int C, int NH,
                         int NKV) override {
    typename Arrays::Output o = Arrays::output(out, this->elems(B, T, C), false);
    cpu_.attention_forward(o.data(), static_cast<float*>(state),
                           Arrays::input(qkv, this->elems(B, T, qkv_width(C, NH, NKV))).data(),
                           B, T, C, NH, NKV);
    o.store();
  }
  void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* /*out*/,
                          const void* state, int B, int T, int C, int NH, int NKV) override {
    const std::size_t n = this->elems(B, T, qkv_width(C, NH, NKV));
    typename Arrays::Output d = Arrays::output(dqkv, n, false);
    cpu_.attention_backward(d.data(), Arrays::input(dout, this->elems(B, T, C)).data(),
                            Arrays::input(qkv, n).data(), static_cast<const float*>(state), B, T,
                            C, NH, NKV);
    d.store();
  }

 private:
  static int qkv_width(int C, int NH, int NKV) { return C + 2 * (C / NH) * NKV; }
  CpuOps cpu_{1};
};

}  // namespace

std::unique_ptr<ops::Ops> make_bf16_cpu_ops() {
  return std::make_unique<StorageCpuOps<Bf16Arrays>>();
}
std::unique_ptr<ops::Ops> make_one_ulp_up_cpu_ops() {
  return std::make_unique<StorageCpuOps<OneUlpUpArrays>>();
}

}  // namespace pptrain::test_support
