// Helpers for the CUDA backend tests: device detection (the tests skip without one),
// host-side bf16 rounding as the device does it, and the closeness check (all_close.hpp).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "all_close.hpp"
#include "core/dtype.hpp"

namespace pptrain::ops::testing {

inline bool cuda_device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

// The bits of the bf16 nearest to x (ties to even), as __float2bfloat16 rounds.
inline uint16_t bf16_bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);  // stays a NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_value(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float x = 0;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}
inline float round_bf16(float x) { return bf16_value(bf16_bits(x)); }

// v rounded to dtype t (unchanged for fp32).
inline std::vector<float> rounded(std::vector<float> v, DType t) {
  if (t == DType::BF16)
    for (float& x : v) x = round_bf16(x);
  return v;
}

// "fp32" / "bf16" as the name of a dtype-parameterised test.
inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& p) {
  return dtype_name(p.param);
}

using test_support::all_close;

}  // namespace pptrain::ops::testing
