// The CUDA backend's own properties, for fp32 and bf16 compute: identity and memory,
// exact precision conversion, squared norms (in order, repeatable) and the linear layer
// without fused epilogues, against the CPU reference. Every op of the default backend is
// compared with the CPU in the op table (cuda_op_table_test.cpp). Skips without a CUDA
// device.
#include "ops/cuda/cuda_ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_ops_fixture.hpp"

namespace pptrain::ops::testing {
namespace {

class CudaOpsCoreTest : public CudaOpsTest {};

TEST_P(CudaOpsCoreTest, Identity) {
  EXPECT_EQ(gpu->compute_dtype(), dtype());
  EXPECT_TRUE(gpu->device_memory());
  EXPECT_NE(gpu->native_stream(), nullptr);
  EXPECT_FALSE(gpu->device_model().empty());
  const std::string name = gpu->name();
  EXPECT_EQ(name, "cuda:0 " + gpu->device_model() + " (" + dtype_name(dtype()) + ")");
  EXPECT_TRUE(cuda_backend_built());
  EXPECT_GE(cuda_device_count(), 1);
  EXPECT_ANY_THROW(make_cuda_ops(cuda_device_count(), dtype()));
}

TEST_P(CudaOpsCoreTest, MemoryRoundTripCopyZeroAndPeak) {
  const std::size_t before = gpu->peak_memory_bytes();
  std::vector<uint8_t> bytes(1000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7 + 1);
  Buffer a(*gpu, bytes.size()), b(*gpu, std::size_t(1) << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.get()) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.get()) % 256, 0u);
  EXPECT_GE(gpu->peak_memory_bytes(), before + bytes.size() + (std::size_t(1) << 20));
  gpu->upload(a.get(), bytes.data(), bytes.size());
  gpu->copy(b.get(), a.get(), bytes.size());
  gpu->fill_zero(static_cast<uint8_t*>(b.get()) + 100, 50);
  std::vector<uint8_t> back(bytes.size(), 0xAB);
  gpu->download(back.data(), b.get(), back.size());
  for (std::size_t i = 0; i < bytes.size(); ++i)
    ASSERT_EQ(back[i], i >= 100 && i < 150 ? 0 : bytes[i]) << "byte " << i;
  gpu->synchronize();
}

TEST_P(CudaOpsCoreTest, ToComputeRoundsToNearestEvenAndToFloatWidens) {
  std::vector<float> x = randn(1001, 1, 100.0f);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = 1.0f + 1.0f / 256, x[3] = 1.0f + 3.0f / 256, x[4] = 3e-39f;
  const Buffer d = act(x);
  const std::vector<float> back = read_act(d, x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = rounded({x[i]}, dtype())[0];
    ASSERT_EQ(std::memcmp(&back[i], &want, sizeof(float)), 0)
        << "element " << i << ": " << x[i] << " -> " << back[i] << ", want " << want;
  }
}

TEST_P(CudaOpsCoreTest, SumSquaresAddsSpansInOrder) {
  const std::vector<float> a = randn(1000, 5), b = randn(7, 6), c = randn(70001, 7, 3.0f);
  Buffer da = f32(a), db = f32(b), dc = f32(c);
  const double got = gpu->sum_squares(
      {{da.f32(), a.size()}, {db.f32(), 0}, {dc.f32(), c.size()}, {db.f32(), b.size()}});
  const double want = cpu->sum_squares(
      {{a.data(), a.size()}, {b.data(), 0}, {c.data(), c.size()}, {b.data(), b.size()}});
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_EQ(gpu->sum_squares({}), 0.0);
  // Deterministic: the same value again, bit for bit.
  EXPECT_EQ(got,
            gpu->sum_squares(
                {{da.f32(), a.size()}, {db.f32(), 0}, {dc.f32(), c.size()}, {db.f32(), b.size()}}));
}

// The op table runs the default (fused) backend; here the one that never fuses.
TEST_P(CudaOpsCoreTest, LinearForwardUnfused) {
  const int N = 74, Cin = 48;
  CudaOps unfused(0, dtype(), /*fuse_epilogues=*/false);
  for (int Cout : {192, 101})
    for (bool with_bias : {true, false})
      for (bool with_gelu : {true, false}) {
        const auto inp = input(N * Cin, 1), w = input(Cin * Cout, 2, 0.3f), bias = input(Cout, 3);
        const std::size_t n = std::size_t(N) * Cout;
        Buffer dinp = act(inp), dw = act(w), dbias = act(bias), dout = act_nan(n),
               dgelu = act_nan(n);
        gpu->synchronize();  // `unfused` runs on a stream of its own
        unfused.linear_forward(dout.act(), with_gelu ? dgelu.act() : nullptr, dinp.act(), dw.act(),
                               with_bias ? dbias.act() : nullptr, N, Cin, Cout);
        unfused.synchronize();
        std::vector<float> out(n), gelu(n);
        cpu->linear_forward(ha(out), with_gelu ? ha(gelu) : nullptr, ha(inp), ha(w),
                            with_bias ? ha(bias) : nullptr, N, Cin, Cout);
        const std::string what = "Cout=" + std::to_string(Cout) +
                                 " bias=" + std::to_string(with_bias) +
                                 " gelu=" + std::to_string(with_gelu);
        EXPECT_TRUE(all_close(read_act(dout, n), out, tol(1e-2))) << what << " out";
        if (with_gelu) {
          EXPECT_TRUE(all_close(read_act(dgelu, n), gelu, tol(1e-2))) << what << " gelu_out";
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpsCoreTest, ::testing::Values(DType::F32, DType::BF16),
                         dtype_param_name);

}  // namespace
}  // namespace pptrain::ops::testing
