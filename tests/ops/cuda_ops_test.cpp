// The CUDA backend against the CPU reference, for fp32 and bf16 compute: identity and
// memory, precision conversion, AdamW, squared norms, products (plain, linear layers
// with and without fused epilogues, weight gradients), bias, LayerNorm, GELU and the
// elementwise ops. Skips without a CUDA device.
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

TEST_P(CudaOpsCoreTest, AdamWMatchesCpu) {
  const std::size_t n = 3001;
  std::vector<float> p = randn(n, 1), g = randn(n, 2), m = randn(n, 3, 0.1f), v = randn(n, 4);
  for (float& x : v) x = x * x * 0.01f;
  const AdamWStep h{
      1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f / (1 - 0.9f * 0.9f), 1.0f / (1 - 0.95f * 0.95f), 0.5f};
  Buffer dp = f32(p), dg = f32(g), dm = f32(m), dv = f32(v), dw = act_nan(n);
  gpu->adamw(dp.f32(), dw.act(), dg.f32(), dm.f32(), dv.f32(), n, h);
  std::vector<float> w(n);
  cpu->adamw(p.data(), ha(w), g.data(), m.data(), v.data(), n, h);
  EXPECT_TRUE(all_close(read_f32(dp, n), p, 1e-5)) << "params";
  EXPECT_TRUE(all_close(read_f32(dm, n), m, 1e-5)) << "m";
  EXPECT_TRUE(all_close(read_f32(dv, n), v, 1e-5)) << "v";
  // bf16: a last-bit difference in params can move the rounded copy by one bf16 step.
  EXPECT_TRUE(all_close(read_act(dw, n), rounded(w, dtype()), tol(1e-2))) << "weights";
  // Without a weight copy.
  gpu->adamw(dp.f32(), nullptr, dg.f32(), dm.f32(), dv.f32(), n, h);
  cpu->adamw(p.data(), nullptr, g.data(), m.data(), v.data(), n, h);
  EXPECT_TRUE(all_close(read_f32(dp, n), p, 1e-5)) << "params, second step";
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

TEST_P(CudaOpsCoreTest, GemmAllTransposesAndBeta) {
  const int M = 37, N = 48, K = 17;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.5f}) {
        const auto a = input(M * K, 1), b = input(K * N, 2);
        auto c = beta != 0.0f ? input(M * N, 3) : std::vector<float>(M * N, NAN);
        Buffer da = act(a), db = act(b), dc = act(c);
        gpu->gemm(ta, tb, M, N, K, 0.75f, da.act(), db.act(), beta, dc.act());
        cpu->gemm(ta, tb, M, N, K, 0.75f, ha(a), ha(b), beta, ha(c));
        EXPECT_TRUE(all_close(read_act(dc, M * N), c, tol(1e-2)))
            << "ta=" << ta << " tb=" << tb << " beta=" << beta;
      }
}

TEST_P(CudaOpsCoreTest, LinearForwardFusedAndUnfused) {
  const int N = 74, Cin = 48;
  CudaOps unfused(0, dtype(), /*fuse_epilogues=*/false);
  for (Ops* ops : {gpu.get(), static_cast<Ops*>(&unfused)})
    for (int Cout : {192, 101})  // 101: no bias+GELU epilogue (aux ld % 8), falls back
      for (bool with_bias : {true, false})
        for (bool with_gelu : {true, false}) {
          const auto inp = input(N * Cin, 1), w = input(Cin * Cout, 2, 0.3f), bias = input(Cout, 3);
          const std::size_t n = std::size_t(N) * Cout;
          Buffer dinp = act(inp), dw = act(w), dbias = act(bias), dout = act_nan(n),
                 dgelu = act_nan(n);
          gpu->synchronize();  // `unfused` runs on a stream of its own
          ops->linear_forward(dout.act(), with_gelu ? dgelu.act() : nullptr, dinp.act(), dw.act(),
                              with_bias ? dbias.act() : nullptr, N, Cin, Cout);
          ops->synchronize();
          std::vector<float> out(n), gelu(n);
          cpu->linear_forward(ha(out), with_gelu ? ha(gelu) : nullptr, ha(inp), ha(w),
                              with_bias ? ha(bias) : nullptr, N, Cin, Cout);
          const std::string what = ops->name() + (ops == gpu.get() ? " fused" : " unfused") +
                                   " Cout=" + std::to_string(Cout) +
                                   " bias=" + std::to_string(with_bias) +
                                   " gelu=" + std::to_string(with_gelu);
          EXPECT_TRUE(all_close(read_act(dout, n), out, tol(1e-2))) << what << " out";
          if (with_gelu) {
            EXPECT_TRUE(all_close(read_act(dgelu, n), gelu, tol(1e-2))) << what << " gelu_out";
          }
        }
}

TEST_P(CudaOpsCoreTest, LinearWeightGradAccumulates) {
  const int N = 74, Cin = 48, Cout = 101;
  const auto inp = input(N * Cin, 1), dout = input(N * Cout, 2);
  std::vector<float> dw = randn(Cin * Cout, 3);
  Buffer dinp = act(inp), ddout = act(dout), ddw = f32(dw);
  gpu->linear_weight_grad(ddw.f32(), dinp.act(), ddout.act(), N, Cin, Cout);
  cpu->linear_weight_grad(dw.data(), ha(inp), ha(dout), N, Cin, Cout);
  // Same (rounded) inputs and fp32 accumulation on both sides.
  EXPECT_TRUE(all_close(read_f32(ddw, dw.size()), dw, tol(1e-4)));
}

TEST_P(CudaOpsCoreTest, AddBiasAndBiasBackward) {
  const int N = 74, C = 101;
  auto out = input(N * C, 1);
  const auto bias = input(C, 2), dout = input(N * C, 3);
  std::vector<float> dbias = randn(C, 4);
  Buffer dout_ = act(out), dbias_in = act(bias), dd = act(dout), ddb = f32(dbias);
  gpu->add_bias(dout_.act(), dbias_in.act(), N, C);
  cpu->add_bias(ha(out), ha(bias), N, C);
  EXPECT_TRUE(all_close(read_act(dout_, out.size()), out, tol(1e-2))) << "add_bias";
  gpu->bias_backward(ddb.f32(), dd.act(), N, C);
  cpu->bias_backward(dbias.data(), ha(dout), N, C);
  EXPECT_TRUE(all_close(read_f32(ddb, C), dbias, tol(1e-4))) << "bias_backward";
}

TEST_P(CudaOpsCoreTest, LayerNormForwardAndBackward) {
  const int N = 74, C = 48;
  const auto x = input(N * C, 1, 2.0f), w = input(C, 2), b = input(C, 3), dy = input(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  Buffer dx = act(x), dw = act(w), db = act(b), ddy = act(dy), dout = act_nan(N * C),
         dmean = f32_nan(N), drstd = f32_nan(N);
  gpu->layernorm_forward(dout.act(), dmean.f32(), drstd.f32(), dx.act(), dw.act(), db.act(), N, C);
  cpu->layernorm_forward(ha(out), mean.data(), rstd.data(), ha(x), ha(w), ha(b), N, C);
  EXPECT_TRUE(all_close(read_act(dout, out.size()), out, tol(1e-2))) << "out";
  EXPECT_TRUE(all_close(read_f32(dmean, N), mean, tol(1e-4))) << "mean";
  EXPECT_TRUE(all_close(read_f32(drstd, N), rstd, tol(1e-4))) << "rstd";

  // Backward from the same saved statistics on both sides; all outputs accumulate.
  auto dinp = input(N * C, 5);
  std::vector<float> dgw = randn(C, 6), dgb = randn(C, 7);
  Buffer ddinp = act(dinp), ddgw = f32(dgw), ddgb = f32(dgb), smean = f32(mean), srstd = f32(rstd);
  gpu->layernorm_backward_input(ddinp.act(), ddy.act(), dx.act(), dw.act(), smean.f32(),
                                srstd.f32(), N, C);
  cpu->layernorm_backward_input(ha(dinp), ha(dy), ha(x), ha(w), mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(all_close(read_act(ddinp, dinp.size()), dinp, tol(2e-2))) << "dinp";
  gpu->layernorm_backward_weight(ddgw.f32(), ddgb.f32(), ddy.act(), dx.act(), smean.f32(),
                                 srstd.f32(), N, C);
  cpu->layernorm_backward_weight(dgw.data(), dgb.data(), ha(dy), ha(x), mean.data(), rstd.data(), N,
                                 C);
  EXPECT_TRUE(all_close(read_f32(ddgw, C), dgw, tol(1e-4))) << "dw";
  EXPECT_TRUE(all_close(read_f32(ddgb, C), dgb, tol(1e-4))) << "db";
}

TEST_P(CudaOpsCoreTest, GeluForwardAndBackwardInPlace) {
  const std::size_t n = 5001;
  const auto x = input(n, 1, 3.0f), dy = input(n, 2);
  std::vector<float> y(n), dx(n);
  Buffer dx_in = act(x), ddy = act(dy), dout = act_nan(n), ddx = act_nan(n);
  gpu->gelu_forward(dout.act(), dx_in.act(), n);
  cpu->gelu_forward(ha(y), ha(x), n);
  EXPECT_TRUE(all_close(read_act(dout, n), y, tol(1e-2))) << "gelu_forward";
  gpu->gelu_backward(ddx.act(), dx_in.act(), ddy.act(), n);
  cpu->gelu_backward(ha(dx), ha(x), ha(dy), n);
  EXPECT_TRUE(all_close(read_act(ddx, n), dx, tol(1e-2))) << "gelu_backward";
  gpu->gelu_backward(ddy.act(), dx_in.act(), ddy.act(), n);  // dinp aliases dout
  EXPECT_TRUE(all_close(read_act(ddy, n), dx, tol(1e-2))) << "gelu_backward in place";
}

TEST_P(CudaOpsCoreTest, Add) {
  const std::size_t n = 4099;
  const auto a = input(n, 1), b = input(n, 2);
  std::vector<float> sum(n);
  Buffer da = act(a), db = act(b), dsum = act_nan(n);
  gpu->add(dsum.act(), da.act(), db.act(), n);
  cpu->add(ha(sum), ha(a), ha(b), n);
  EXPECT_TRUE(all_close(read_act(dsum, n), sum, tol(1e-2))) << "add";
  gpu->add(da.act(), da.act(), db.act(), n);  // out aliases a
  EXPECT_TRUE(all_close(read_act(da, n), sum, tol(1e-2))) << "add in place";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpsCoreTest, ::testing::Values(DType::F32, DType::BF16),
                         dtype_param_name);

}  // namespace
}  // namespace pptrain::ops::testing
