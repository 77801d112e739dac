// Counter-based random numbers: every draw is a pure function of its key (seed,
// stream, index), never of call order or rank layout. This is what makes data
// order and initialisation identical across parallel layouts and on resume.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace pptrain {

// SplitMix64 finaliser: a strong 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Hash of several 64-bit words.
inline uint64_t hash_words(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

// FNV-1a of a string, to turn names into stream ids.
inline uint64_t hash_string(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Uniform double in [0, 1) from a 64-bit key.
inline double uniform01(uint64_t key) { return double(mix64(key) >> 11) * 0x1.0p-53; }

// Standard normal from a 64-bit key (Box-Muller on two derived uniforms).
inline double standard_normal(uint64_t key) {
  double u1 = uniform01(key ^ 0x5851F42D4C957F2Dull);
  double u2 = uniform01(key ^ 0x14057B7EF767814Full);
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace pptrain
