// The standard normal draw of random.hpp. log and cos are polynomials in plain double
// arithmetic (compiled without FMA contraction), so the scalar draw and the vectorised
// block give the same bits, on every machine and whatever vector width runs them.
#include "core/random.hpp"

#include <bit>
#include <cmath>

#include "core/wide_clones.hpp"

namespace pptrain {

namespace {

// log(u) for u in (0, 1]. u = 2^e m with m in [sqrt(1/2), sqrt(2)); with f = m - 1 and
// s = f / (2 + f), log(m) = 2 atanh(s) = f - f^2/2 + s (f^2/2 + R), where
// R = 2 s^2/3 + 2 s^4/5 + ... (|s| < 0.1716: ten terms leave under 1e-18).
inline double log_unit(double u) {
  const uint64_t bits = std::bit_cast<uint64_t>(u);
  const int32_t e = int32_t(bits >> 52) - 1023;  // u is normal and positive
  double m = std::bit_cast<double>((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  const bool high = m > 1.4142135623730951;
  m = high ? 0.5 * m : m;
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double r = 2.0 / 21.0;
  r = r * z + 2.0 / 19.0;
  r = r * z + 2.0 / 17.0;
  r = r * z + 2.0 / 15.0;
  r = r * z + 2.0 / 13.0;
  r = r * z + 2.0 / 11.0;
  r = r * z + 2.0 / 9.0;
  r = r * z + 2.0 / 7.0;
  r = r * z + 2.0 / 5.0;
  r = r * z + 2.0 / 3.0;
  r = r * z;
  const double hfsq = 0.5 * f * f;
  const double log_m = f - (hfsq - s * (hfsq + r));
  // ln 2 split so that e * kLn2Hi is exact (its low 21 bits are zero).
  const double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double de = double(e) + (high ? 1.0 : 0.0);
  return de * kLn2Hi + (log_m + de * kLn2Lo);
}

// cos(2 pi t) for t = k 2^-53 in [0, 1). The reductions are exact in double: by
// symmetry t goes to [0, 1/4] (a sign), and to cos or sin of 2 pi t' with t' in
// [0, 1/8], so the Taylor series below (|x| <= pi/4) stop under 1e-18.
inline double cos_two_pi(double t) {
  t = t > 0.5 ? 1.0 - t : t;
  const bool negate = t > 0.25;
  t = negate ? 0.5 - t : t;
  const bool use_sin = t > 0.125;
  t = use_sin ? 0.25 - t : t;
  const double x = t * 6.283185307179586;
  const double z = x * x;
  double c = 1.0 / 20922789888000.0;  // 1/16!
  c = c * z - 1.0 / 87178291200.0;
  c = c * z + 1.0 / 479001600.0;
  c = c * z - 1.0 / 3628800.0;
  c = c * z + 1.0 / 40320.0;
  c = c * z - 1.0 / 720.0;
  c = c * z + 1.0 / 24.0;
  c = c * z * z;
  const double cos_x = (1.0 - 0.5 * z) + c;
  double p = 1.0 / 355687428096000.0;  // 1/17!
  p = p * z - 1.0 / 1307674368000.0;
  p = p * z + 1.0 / 6227020800.0;
  p = p * z - 1.0 / 39916800.0;
  p = p * z + 1.0 / 362880.0;
  p = p * z - 1.0 / 5040.0;
  p = p * z + 1.0 / 120.0;
  p = p * z - 1.0 / 6.0;
  const double sin_x = x + x * (z * p);
  const double v = use_sin ? sin_x : cos_x;
  return negate ? -v : v;
}

inline double normal_from_uniforms(double u1, double u2) {
  u1 = u1 < 1e-300 ? 1e-300 : u1;
  return std::sqrt(-2.0 * log_unit(u1)) * cos_two_pi(u2);
}

// uniform01(key), with the conversion of the 53-bit integer to double written as two
// exact 32-bit halves (2^52 and 2^84 added in the exponent bits, then subtracted), which
// vectorises where a 64-bit integer conversion does not. The result is the same double.
inline double uniform01_split(uint64_t key) {
  const uint64_t v = mix64(key) >> 11;
  const double high = std::bit_cast<double>(0x4530000000000000ull | (v >> 32)) - 0x1.0p84;
  const double low = std::bit_cast<double>(0x4330000000000000ull | (v & 0xFFFFFFFFull)) - 0x1.0p52;
  return (high + low) * 0x1.0p-53;
}

inline double first_uniform(uint64_t key) { return uniform01_split(key ^ 0x5851F42D4C957F2Dull); }
inline double second_uniform(uint64_t key) { return uniform01_split(key ^ 0x14057B7EF767814Full); }

}  // namespace

double standard_normal(uint64_t key) { return normal_from_uniforms(first_uniform(key), second_uniform(key)); }

PPTRAIN_WIDE_CLONES
void fill_standard_normal(uint64_t stream, uint64_t first, std::size_t count, double scale,
                          float* out) {
  // hash_words(stream, i) = mix64(mix64(mix64(mix64(stream) ^ i))) with zero words c, d.
  const uint64_t head = mix64(stream);
  constexpr std::size_t kBlock = 256;
  double u1[kBlock], u2[kBlock];
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t n = count - begin < kBlock ? count - begin : kBlock;
    for (std::size_t k = 0; k < n; ++k) {
      const uint64_t key = mix64(mix64(mix64(head ^ (first + begin + k))));
      u1[k] = first_uniform(key);
      u2[k] = second_uniform(key);
    }
    for (std::size_t k = 0; k < n; ++k) out[begin + k] = float(scale * normal_from_uniforms(u1[k], u2[k]));
  }
}

}  // namespace pptrain
