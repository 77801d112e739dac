// The cuBLASLt wrapper against a host fp64 reference: odd shapes, all transposes,
// batched, bias and bias+GELU epilogues, mixed-precision weight-gradient accumulation,
// misaligned pointers, and the plan cache. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "cuda_test_util.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_raii.hpp"
#include "ops/cuda/gemm.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops::cuda {
namespace {

using ops::testing::all_close;
using ops::testing::bf16_bits;
using ops::testing::bf16_value;
using ops::testing::randn;
using ops::testing::rounded;

double tolerance(DType t) { return t == DType::F32 ? 1e-5 : 1e-2; }

// Host values in device memory as dtype t, with `pad` spare elements in front (to
// test pointers that are not 256-byte aligned).
struct DeviceArray {
  DeviceMemory mem;
  DType t = DType::F32;
  std::size_t n = 0, pad = 0;
  void* data() const { return static_cast<char*>(mem.get()) + pad * dtype_size(t); }
};

DeviceArray to_device(const std::vector<float>& host, DType t, std::size_t pad = 0) {
  DeviceArray a{DeviceMemory((host.size() + pad) * dtype_size(t)), t, host.size(), pad};
  if (t == DType::F32) {
    PPTRAIN_CUDA_CHECK(
        cudaMemcpy(a.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  } else {
    std::vector<uint16_t> bits(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) bits[i] = bf16_bits(host[i]);
    PPTRAIN_CUDA_CHECK(cudaMemcpy(a.data(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  }
  // A pageable upload may return before its DMA lands, and the test stream does not
  // wait for the legacy stream.
  PPTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  return a;
}

std::vector<float> to_host(const DeviceArray& a) {
  std::vector<float> host(a.n);
  if (a.t == DType::F32) {
    PPTRAIN_CUDA_CHECK(
        cudaMemcpy(host.data(), a.data(), a.n * sizeof(float), cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> bits(a.n);
    PPTRAIN_CUDA_CHECK(cudaMemcpy(bits.data(), a.data(), a.n * 2, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < a.n; ++i) host[i] = bf16_value(bits[i]);
  }
  return host;
}

// C[M,N] = alpha * op(A) op(B) + beta * C0 (+ bias[N]) in fp64, row-major, per batch.
std::vector<double> reference(const GemmProblem& p, float alpha, const std::vector<float>& A,
                              const std::vector<float>& B, float beta, const std::vector<float>& C0,
                              const std::vector<float>* bias) {
  std::vector<double> C(std::size_t(p.batch) * p.M * p.N);
  for (int b = 0; b < p.batch; ++b) {
    const float* a = A.data() + b * p.stride_a;
    const float* bb = B.data() + b * p.stride_b;
    for (int i = 0; i < p.M; ++i)
      for (int j = 0; j < p.N; ++j) {
        double s = 0.0;
        for (int k = 0; k < p.K; ++k)
          s += double(p.trans_a ? a[k * p.M + i] : a[i * p.K + k]) *
               double(p.trans_b ? bb[j * p.K + k] : bb[k * p.N + j]);
        const std::size_t at = std::size_t(b) * p.stride_c + std::size_t(i) * p.N + j;
        C[at] = alpha * s + (beta != 0.0f ? beta * double(C0[at]) : 0.0) +
                (bias ? double((*bias)[j]) : 0.0);
      }
  }
  return C;
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

class CudaGemmTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!ops::testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    PPTRAIN_CUDA_CHECK(cudaSetDevice(0));
    stream = std::make_unique<Stream>();
    gemm = std::make_unique<Gemm>();
  }
  void sync() { PPTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream->get())); }

  // Runs p on random inputs (with C0 when beta != 0) and checks against the reference.
  void check(GemmProblem p, float alpha, float beta, std::size_t pad = 0) {
    const DType t = GetParam();
    p.ab = p.cd = t;
    p.accumulate = beta != 0.0f;
    const std::size_t na = std::size_t(p.batch) * p.M * p.K, nb = std::size_t(p.batch) * p.K * p.N,
                      nc = std::size_t(p.batch) * p.M * p.N;
    if (p.batch > 1) {
      p.stride_a = int64_t(p.M) * p.K;
      p.stride_b = int64_t(p.K) * p.N;
      p.stride_c = int64_t(p.M) * p.N;
    }
    const auto A = rounded(randn(na, 1), t), B = rounded(randn(nb, 2), t);
    const auto C0 = beta != 0.0f ? rounded(randn(nc, 3), t) : std::vector<float>(nc, NAN);
    DeviceArray dA = to_device(A, t, pad), dB = to_device(B, t, pad), dC = to_device(C0, t, pad);
    gemm->run(p, alpha, {dA.data(), dB.data(), dC.data()}, beta, stream->get());
    sync();
    EXPECT_TRUE(all_close(to_host(dC), reference(p, alpha, A, B, beta, C0, nullptr), tolerance(t)))
        << p.describe();
  }

  std::unique_ptr<Stream> stream;
  std::unique_ptr<Gemm> gemm;
};

TEST_P(CudaGemmTest, OddShapesAllTransposes) {
  // Each of 1, 3, 17, 64, 129, 768 appears as M, N and K.
  const int shapes[][3] = {{1, 1, 1},      {3, 17, 129},   {17, 3, 64},   {64, 129, 17},
                           {129, 64, 768}, {768, 17, 3},   {1, 768, 129}, {129, 1, 17},
                           {17, 129, 1},   {768, 768, 64}, {3, 64, 768}};
  for (const auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        GemmProblem p;
        p.trans_a = ta, p.trans_b = tb, p.M = s[0], p.N = s[1], p.K = s[2];
        check(p, 1.0f, 0.0f);
      }
}

TEST_P(CudaGemmTest, AlphaBetaAccumulate) {
  GemmProblem p;
  p.M = 17, p.N = 64, p.K = 129;
  check(p, 0.5f, 1.0f);
  p.trans_a = true;
  check(p, -1.25f, 0.75f);
}

TEST_P(CudaGemmTest, StridedBatched) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmProblem p;
      p.trans_a = ta, p.trans_b = tb, p.M = 37, p.N = 12, p.K = 37, p.batch = 8;
      check(p, 1.0f, 0.0f);
      p.N = 37, p.K = 12;
      check(p, 1.0f, 0.0f);
    }
}

TEST_P(CudaGemmTest, MisalignedPointers) {
  GemmProblem p;
  p.M = 17, p.N = 64, p.K = 48;
  check(p, 1.0f, 0.0f, /*pad=*/1);
  check(p, 1.0f, 0.5f, /*pad=*/3);
}

TEST_P(CudaGemmTest, BiasEpilogue) {
  const DType t = GetParam();
  GemmProblem p;
  p.M = 17, p.N = 64, p.K = 129, p.ab = p.cd = t, p.epilogue = Epilogue::kBias;
  const auto A = rounded(randn(17 * 129, 4), t), B = rounded(randn(129 * 64, 5), t),
             bias = rounded(randn(64, 6), t);
  DeviceArray dA = to_device(A, t), dB = to_device(B, t), dbias = to_device(bias, t),
              dC = to_device(std::vector<float>(17 * 64, NAN), t);
  ASSERT_TRUE(
      gemm->try_run(p, 1.0f, {dA.data(), dB.data(), dC.data(), dbias.data()}, 0.0f, stream->get()));
  sync();
  EXPECT_TRUE(all_close(to_host(dC), reference(p, 1.0f, A, B, 0.0f, {}, &bias), tolerance(t)));
}

TEST_P(CudaGemmTest, BiasGeluEpilogueWritesPreActivationToAux) {
  const DType t = GetParam();
  GemmProblem p;
  p.M = 37, p.N = 64, p.K = 48, p.ab = p.cd = t, p.epilogue = Epilogue::kGeluAuxBias;
  const auto A = rounded(randn(37 * 48, 7), t), B = rounded(randn(48 * 64, 8, 0.3f), t),
             bias = rounded(randn(64, 9), t);
  DeviceArray dA = to_device(A, t), dB = to_device(B, t), dbias = to_device(bias, t),
              dD = to_device(std::vector<float>(37 * 64, NAN), t),
              daux = to_device(std::vector<float>(37 * 64, NAN), t);
  if (!gemm->try_run(p, 1.0f, {dA.data(), dB.data(), dD.data(), dbias.data(), daux.data()}, 0.0f,
                     stream->get()))
    GTEST_SKIP() << "cuBLASLt offers no bias+GELU algorithm here (the ops fall back)";
  sync();
  const std::vector<double> pre = reference(p, 1.0f, A, B, 0.0f, {}, &bias);
  std::vector<double> gelu(pre.size());
  for (std::size_t i = 0; i < pre.size(); ++i) gelu[i] = gelu_tanh(pre[i]);
  EXPECT_TRUE(all_close(to_host(daux), pre, tolerance(t))) << "aux (pre-activation)";
  // cuBLASLt's GELU is the tanh form, possibly with a fast tanh (so CudaOps fuses it
  // only for bf16 activations): a looser bound for fp32.
  EXPECT_TRUE(all_close(to_host(dD), gelu, t == DType::F32 ? 5e-4 : tolerance(t)))
      << "D (tanh GELU)";
  // The aux leading dimension must be a multiple of 8: no algorithm for N = 3.
  p.N = 3;
  EXPECT_FALSE(gemm->try_run(p, 1.0f, {dA.data(), dB.data(), dD.data(), dbias.data(), daux.data()},
                             0.0f, stream->get()));
}

// DGELU: D = (A @ B^T) times gelu' at aux (the forward's GELU input), as the MLP's
// input gradient: dinp[N,Cin] = dout[N,Cout] @ w[Cin,Cout]^T, scaled.
TEST_P(CudaGemmTest, DGeluEpilogueScalesByTheGeluSlopeAtAux) {
  const DType t = GetParam();
  GemmProblem p;
  p.trans_b = true, p.M = 37, p.N = 64, p.K = 48, p.ab = p.cd = t, p.epilogue = Epilogue::kDGelu;
  const auto A = rounded(randn(37 * 48, 13), t), B = rounded(randn(64 * 48, 14, 0.3f), t),
             aux = rounded(randn(37 * 64, 15, 2.0f), t);
  DeviceArray dA = to_device(A, t), dB = to_device(B, t), daux = to_device(aux, t),
              dD = to_device(std::vector<float>(37 * 64, NAN), t);
  if (!gemm->try_run(p, 1.0f, {dA.data(), dB.data(), dD.data(), nullptr, daux.data()}, 0.0f,
                     stream->get()))
    GTEST_SKIP() << "cuBLASLt offers no DGELU algorithm here (the ops fall back)";
  sync();
  std::vector<double> want = reference(p, 1.0f, A, B, 0.0f, {}, nullptr);
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double h = 1e-4, x = aux[i];  // the slope of the tanh GELU, by central difference
    want[i] *= (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2 * h);
  }
  EXPECT_TRUE(all_close(to_host(dD), want, t == DType::F32 ? 5e-4 : tolerance(t)));
  EXPECT_TRUE(all_close(to_host(daux), std::vector<double>(aux.begin(), aux.end()), 0.0))
      << "aux is read, not written";
}

TEST_P(CudaGemmTest, WeightGradAccumulatesInFloat) {
  // dw[Cin,Cout] += inp[N,Cin]^T @ dout[N,Cout]: inputs in the compute dtype, dw fp32.
  const DType t = GetParam();
  const int N = 129, Cin = 48, Cout = 17;
  GemmProblem p;
  p.trans_a = true, p.M = Cin, p.N = Cout, p.K = N, p.ab = t, p.cd = DType::F32;
  p.accumulate = true;
  const auto inp = rounded(randn(N * Cin, 10), t), dout = rounded(randn(N * Cout, 11), t),
             dw0 = randn(Cin * Cout, 12);
  DeviceArray dinp = to_device(inp, t), ddout = to_device(dout, t),
              ddw = to_device(dw0, DType::F32);
  gemm->run(p, 1.0f, {dinp.data(), ddout.data(), ddw.data()}, 1.0f, stream->get());
  gemm->run(p, 1.0f, {dinp.data(), ddout.data(), ddw.data()}, 1.0f, stream->get());
  sync();
  std::vector<double> want = reference(p, 2.0f, inp, dout, 1.0f, dw0, nullptr);
  // Products of rounded inputs accumulate in fp32 either way: fp32 tolerance.
  EXPECT_TRUE(all_close(to_host(ddw), want, 1e-5));
}

TEST_P(CudaGemmTest, SecondCallOfAShapeHitsThePlanCache) {
  GemmProblem p;
  p.M = 17, p.N = 64, p.K = 129;
  EXPECT_EQ(gemm->cache_size(), 0u);
  check(p, 1.0f, 0.0f);
  EXPECT_EQ(gemm->cache_size(), 1u);
  check(p, 1.0f, 0.0f);
  EXPECT_EQ(gemm->cache_size(), 1u);
  p.K = 3;
  check(p, 1.0f, 0.0f);
  EXPECT_EQ(gemm->cache_size(), 2u);
}

TEST_P(CudaGemmTest, EpilogueOnBatchedProblemIsRefused) {
  GemmProblem p;
  p.M = 4, p.N = 8, p.K = 4, p.batch = 2, p.epilogue = Epilogue::kBias;
  DeviceArray d = to_device(std::vector<float>(64, 0.0f), GetParam());
  EXPECT_ANY_THROW(
      gemm->run(p, 1.0f, {d.data(), d.data(), d.data(), d.data()}, 0.0f, stream->get()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaGemmTest, ::testing::Values(DType::F32, DType::BF16),
                         ops::testing::dtype_param_name);

}  // namespace
}  // namespace pptrain::ops::cuda
