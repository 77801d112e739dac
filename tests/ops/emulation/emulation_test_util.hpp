// Helpers for the emulated-kernel tests: "device" arrays (host memory, aligned as
// cudaMalloc aligns, optionally skewed to defeat the 16-byte paths, fenced by poison that
// must survive), random inputs, rounding to the element type, schedule-order scopes, and the
// closeness check (all_close.hpp; outputs start poisoned, so an unwritten one fails).
#pragma once
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../all_close.hpp"

namespace pptrain::emulation_test {

using bf16 = __nv_bfloat16;

// Runs f and returns the message of the exception it throws ("" when none).
template <typename F>
std::string thrown(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The schedule order of this thread's emulated launches while in scope.
class ScopedOrder {
 public:
  explicit ScopedOrder(pptrain_emu::ScheduleOrder o) : saved_(pptrain_emu::schedule_order()) {
    pptrain_emu::set_schedule_order(o);
  }
  ~ScopedOrder() { pptrain_emu::set_schedule_order(saved_); }
  ScopedOrder(const ScopedOrder&) = delete;
  ScopedOrder& operator=(const ScopedOrder&) = delete;

 private:
  pptrain_emu::ScheduleOrder saved_;
};

inline std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// v rounded to T's precision (unchanged for float).
template <typename T>
std::vector<float> rounded(std::vector<float> v) {
  if constexpr (std::is_same_v<T, bf16>)
    for (float& x : v) x = __bfloat162float(__float2bfloat16_rn(x));
  return v;
}

// The element types of the typed tests, named fp32 and bf16.
using ElementTypes = ::testing::Types<float, bf16>;
struct ElementTypeNames {
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, bf16> ? "bf16" : "fp32";
  }
};

// fp32 or bf16 tolerance by element type.
template <typename T>
constexpr double tol(double fp32, double bf16_tol = 2e-2) {
  return std::is_same_v<T, bf16> ? bf16_tol : fp32;
}

// n elements of T in host memory standing in for device memory: 256-byte aligned, or
// `skew` elements past that; 256 bytes of poison (0xFF) on each side, checked when the
// array goes away. New contents are poison too (NaN for float and bf16). Launches are
// queued (emulator_streams.hpp): reading, writing or dropping the array first
// synchronises the device, so the kernels queued before have run.
template <typename T>
class Device {
 public:
  static constexpr std::size_t kFence = 256;
  explicit Device(std::size_t n, std::size_t skew = 0)
      : n_(n),
        offset_(kFence + skew * sizeof(T)),
        bytes_((offset_ + n * sizeof(T) + 2 * kFence + 255) / 256 * 256),
        base_(static_cast<unsigned char*>(std::aligned_alloc(256, bytes_))) {
    std::memset(base_, 0xFF, bytes_);
  }
  template <typename U>
  Device(const std::vector<U>& v, std::size_t skew = 0) : Device(v.size(), skew) {
    write(v);
  }
  ~Device() {
    (void)cudaDeviceSynchronize();
    const std::size_t end = offset_ + n_ * sizeof(T);
    const bool ok =
        std::all_of(base_, base_ + offset_, [](unsigned char c) { return c == 0xFF; }) &&
        std::all_of(base_ + end, base_ + bytes_, [](unsigned char c) { return c == 0xFF; });
    std::free(base_);
    if (!ok) ADD_FAILURE() << "a kernel wrote outside an array of " << n_ << " elements";
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  T* get() { return reinterpret_cast<T*>(base_ + offset_); }
  const T* get() const { return reinterpret_cast<const T*>(base_ + offset_); }
  std::size_t size() const { return n_; }
  template <typename U>
  void write(const std::vector<U>& v) {
    (void)cudaDeviceSynchronize();
    for (std::size_t i = 0; i < n_; ++i) get()[i] = static_cast<T>(v.at(i));
  }
  std::vector<float> read() const {
    (void)cudaDeviceSynchronize();
    std::vector<float> v(n_);
    for (std::size_t i = 0; i < n_; ++i) v[i] = static_cast<float>(get()[i]);
    return v;
  }
  std::vector<T> raw() const {
    (void)cudaDeviceSynchronize();
    return std::vector<T>(get(), get() + n_);
  }

 private:
  std::size_t n_, offset_, bytes_;
  unsigned char* base_;
};

using test_support::all_close;

}  // namespace pptrain::emulation_test
