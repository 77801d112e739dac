// Counter-based random numbers: every draw is a pure function of its key (seed,
// stream, index), never of call order or rank layout. This is what makes data
// order and initialisation identical across parallel layouts and on resume.
#pragma once
#include <cstddef>
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

// Standard normal from a 64-bit key: Box-Muller on two uniforms derived from the key,
// sqrt(-2 log u1) cos(2 pi u2), with log and cos computed in double by random.cpp's own
// polynomials (within a few units in the last place of the C library's), so every
// machine draws the same bits.
double standard_normal(uint64_t key);

// out[k] = float(scale * standard_normal(hash_words(stream, first + k))) for k < count:
// the same bits as that loop, vectorised.
void fill_standard_normal(uint64_t stream, uint64_t first, std::size_t count, double scale,
                          float* out);

}  // namespace pptrain
