// Fixture for the CUDA backend tests: make_cuda_ops(0, dtype) next to the CPU
// reference make_cpu_ops(1), with helpers that move host vectors into the CUDA
// backend's memory (Act arrays go up as fp32 and through to_compute) and back (through
// to_float). Inputs are drawn rounded to the compute dtype so both backends see the
// same values and a comparison measures the op, not the input rounding.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda_test_util.hpp"
#include "ops/ops.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops::testing {

class CudaOpsTest : public ::testing::TestWithParam<DType> {
 public:  // helpers of the tests below and of their free functions
  void SetUp() override {
    if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    gpu = make_cuda_ops(0, dtype());
    cpu = make_cpu_ops(1);
  }

  DType dtype() const { return GetParam(); }
  bool bf16() const { return dtype() == DType::BF16; }
  // Relative tolerance (to the largest reference magnitude): fp32 or the given bf16 one.
  double tol(double bf16_tol = 2e-2) const { return bf16() ? bf16_tol : 1e-5; }
  // n normal values times scale, rounded to the compute dtype.
  std::vector<float> input(std::size_t n, uint64_t seed, float scale = 1.0f) const {
    return rounded(randn(n, seed, scale), dtype());
  }

  Buffer f32(const std::vector<float>& host) {
    Buffer b(*gpu, host.size() * sizeof(float));
    gpu->upload(b.get(), host.data(), host.size() * sizeof(float));
    return b;
  }
  Buffer i32(const std::vector<int32_t>& host) {
    Buffer b(*gpu, host.size() * sizeof(int32_t));
    gpu->upload(b.get(), host.data(), host.size() * sizeof(int32_t));
    return b;
  }
  Buffer act(const std::vector<float>& host) {
    const Buffer staging = f32(host);
    Buffer b(*gpu, host.size() * dtype_size(dtype()));
    gpu->to_compute(b.act(), staging.f32(), host.size());
    return b;
  }
  // Outputs start as NaN, so an element the op does not write fails the comparison.
  Buffer f32_nan(std::size_t n) { return f32(std::vector<float>(n, NAN)); }
  Buffer act_nan(std::size_t n) { return act(std::vector<float>(n, NAN)); }

  std::vector<float> read_f32(const Buffer& b, std::size_t n) {
    std::vector<float> host(n);
    gpu->download(host.data(), b.get(), n * sizeof(float));
    return host;
  }
  std::vector<float> read_act(const Buffer& b, std::size_t n) {
    const Buffer staging(*gpu, n * sizeof(float));
    gpu->to_float(staging.f32(), b.act(), n);
    return read_f32(staging, n);
  }

  std::unique_ptr<Ops> gpu;
  std::unique_ptr<Ops> cpu;
};

// A host fp32 vector as the CPU backend's Act array.
inline Act* ha(std::vector<float>& v) { return as_act(v.data()); }
inline const Act* ha(const std::vector<float>& v) { return as_act(v.data()); }

}  // namespace pptrain::ops::testing
