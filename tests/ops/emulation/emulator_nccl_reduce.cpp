// The emulated NCCL's reductions, in rank order so every rank computes the same bits:
// acc = x0; acc = acc op x1; ... Floating types accumulate in fp32 (fp64 for fp64) and
// round once to the element type at the end: for fp32 that is fp32 arithmetic step by
// step; for bf16 and fp16 it is one rounding where a ring would round at every step (a
// documented difference from real NCCL, whose order and rounding depend on its
// algorithm). Integers wrap; avg is the sum divided by the number of ranks (integer
// division for integers); max and min return NaN when any input is NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "emulator_nccl.hpp"

namespace pptrain_emu::nccl_emu {

namespace {

std::uint16_t half_bits_rn(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above round to infinity
  if (x >= 0x38800000u) {                       // a normal half (2^-14 and above)
    std::uint32_t v = x - (112u << 23);         // exponent bias 127 -> 15
    v += 0xFFFu + ((v >> 13) & 1u);             // round the mantissa to nearest even
    return sign | static_cast<std::uint16_t>(v >> 13);
  }
  float magnitude;
  std::memcpy(&magnitude, &x, 4);
  // Subnormal halves are multiples of 2^-24; scaling by 2^24 is exact.
  return sign | static_cast<std::uint16_t>(std::nearbyint(magnitude * 16777216.0f));
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  std::uint32_t bits;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  bits = e == 31 ? sign | 0x7F800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element access: Acc is the type the reduction runs in.
template <typename T>
struct Plain {
  using Acc = T;
  static Acc load(const std::byte* p, std::size_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  }
  static void store(std::byte* p, std::size_t i, Acc v) {
    std::memcpy(p + i * sizeof(T), &v, sizeof(T));
  }
};
struct Half {
  using Acc = float;
  static Acc load(const std::byte* p, std::size_t i) {
    std::uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return half_to_float(b);
  }
  static void store(std::byte* p, std::size_t i, Acc v) {
    const std::uint16_t b = half_bits_rn(v);
    std::memcpy(p + 2 * i, &b, 2);
  }
};
struct BFloat {
  using Acc = float;
  static Acc load(const std::byte* p, std::size_t i) {
    BFloat16 b;
    std::memcpy(&b.bits, p + 2 * i, 2);
    return static_cast<float>(b);
  }
  static void store(std::byte* p, std::size_t i, Acc v) {
    const std::uint16_t b = bf16_bits_rn(v);
    std::memcpy(p + 2 * i, &b, 2);
  }
};

template <typename A>
A combine(A a, A b, ncclRedOp_t op) {
  if constexpr (std::is_floating_point_v<A>) {
    switch (op) {
      case ncclProd: return a * b;
      case ncclMax:
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
        return a < b ? b : a;
      case ncclMin:
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
        return b < a ? b : a;
      default: return a + b;  // sum, avg
    }
  } else {
    using U = std::make_unsigned_t<A>;  // wrapping arithmetic
    switch (op) {
      case ncclProd: return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
      case ncclMax: return a < b ? b : a;
      case ncclMin: return b < a ? b : a;
      default: return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    }
  }
}

template <typename Access>
void reduce_as(ncclRedOp_t op, const std::vector<const std::byte*>& inputs, std::byte* out,
               std::size_t count) {
  using Acc = typename Access::Acc;
  const std::size_t n = inputs.size();
  for (std::size_t i = 0; i < count; ++i) {
    Acc acc = Access::load(inputs[0], i);
    for (std::size_t r = 1; r < n; ++r) acc = combine(acc, Access::load(inputs[r], i), op);
    if (op == ncclAvg) {
      if constexpr (std::is_floating_point_v<Acc>)
        acc /= static_cast<Acc>(n);
      else if constexpr (std::is_signed_v<Acc>)
        acc = static_cast<Acc>(static_cast<std::int64_t>(acc) / static_cast<std::int64_t>(n));
      else
        acc = static_cast<Acc>(static_cast<std::uint64_t>(acc) / n);
    }
    Access::store(out, i, acc);
  }
}

}  // namespace

void reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const std::byte*>& inputs,
            std::byte* out, std::size_t count) {
  switch (type) {
    case ncclInt8: return reduce_as<Plain<std::int8_t>>(op, inputs, out, count);
    case ncclUint8: return reduce_as<Plain<std::uint8_t>>(op, inputs, out, count);
    case ncclInt32: return reduce_as<Plain<std::int32_t>>(op, inputs, out, count);
    case ncclUint32: return reduce_as<Plain<std::uint32_t>>(op, inputs, out, count);
    case ncclInt64: return reduce_as<Plain<std::int64_t>>(op, inputs, out, count);
    case ncclUint64: return reduce_as<Plain<std::uint64_t>>(op, inputs, out, count);
    case ncclFloat16: return reduce_as<Half>(op, inputs, out, count);
    case ncclFloat32: return reduce_as<Plain<float>>(op, inputs, out, count);
    case ncclFloat64: return reduce_as<Plain<double>>(op, inputs, out, count);
    case ncclBfloat16: return reduce_as<BFloat>(op, inputs, out, count);
    default: throw std::logic_error("emulated NCCL: reduce of an unchecked type");
  }
}

}  // namespace pptrain_emu::nccl_emu
