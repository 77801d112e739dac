// The CUDA backend's fused attention (flash_attention on) against the CPU reference, for
// fp32 and bf16 compute: head sizes and lengths around the kernels' tiles, unaligned
// arrays, repeatability. The default backend's attention, embedding and cross-entropy
// are compared with the CPU in the op table (cuda_op_table_test.cpp). Skips without a
// CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_ops_fixture.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace pptrain::ops::testing {
namespace {

class CudaOpsModelTest : public CudaOpsTest {};

// host in the GPU's memory as the compute dtype, starting `skip` elements into the
// returned buffer (an odd skip leaves it without 16-byte alignment).
Buffer act_at(CudaOpsModelTest& t, const std::vector<float>& host, int skip) {
  const Buffer staging = t.f32(host);
  Buffer b(*t.gpu, (host.size() + skip) * dtype_size(t.dtype()));
  t.gpu->to_compute(advance(b.act(), skip, t.dtype()), staging.f32(), host.size());
  return b;
}

// The unfused attention's state: the probabilities in the compute dtype.
std::size_t unfused_state(const CudaOpsModelTest& t, int B, int T, int NH) {
  return std::size_t(B) * NH * T * T * dtype_size(t.dtype());
}

// Attention forward and backward of shape (B, T, C, NH, NKV) on t.gpu against the CPU;
// the GPU's state is expected to take state_bytes. qkv and dout sit `skip` elements into
// their buffers.
void check_attention(CudaOpsModelTest& t, int B, int T, int C, int NH, int NKV,
                     std::size_t state_bytes, int skip = 0) {
  const std::size_t N = std::size_t(B) * T;
  Ops& gpu = *t.gpu;
  Ops& cpu = *t.cpu;
  const DType dt = t.dtype();
  EXPECT_EQ(gpu.attention_state_bytes(B, T, NH), state_bytes);
  const auto qkv = t.input(N * (C + 2 * (C / NH) * NKV), 1), dout = t.input(N * C, 2);
  Buffer qkv_buf = act_at(t, qkv, skip), dout_buf = act_at(t, dout, skip),
         dout_fwd = t.act_nan(N * C), ddqkv = t.act_nan(qkv.size()), state(gpu, state_bytes);
  const Act* dqkv_in = advance(qkv_buf.act(), skip, dt);
  const Act* ddout = advance(dout_buf.act(), skip, dt);
  std::vector<float> out(N * C), dqkv(qkv.size()),
      cstate(cpu.attention_state_bytes(B, T, NH) / sizeof(float));
  gpu.attention_forward(dout_fwd.act(), state.get(), dqkv_in, B, T, C, NH, NKV);
  cpu.attention_forward(ha(out), cstate.data(), ha(qkv), B, T, C, NH, NKV);
  EXPECT_TRUE(all_close(t.read_act(dout_fwd, out.size()), out, t.tol(2e-2))) << "out";
  gpu.attention_backward(ddqkv.act(), ddout, dqkv_in, dout_fwd.act(), state.get(), B, T, C, NH,
                         NKV);
  cpu.attention_backward(ha(dqkv), ha(dout), ha(qkv), ha(out), cstate.data(), B, T, C, NH, NKV);
  // bf16: probabilities, scores and their gradients are all rounded on the way.
  EXPECT_TRUE(all_close(t.read_act(ddqkv, dqkv.size()), dqkv, t.tol(3e-2))) << "dqkv";
}

// The default backend (compared with the CPU in the op table) saves the probabilities.
TEST_P(CudaOpsModelTest, UnfusedAttentionStateIsTheProbabilities) {
  EXPECT_EQ(gpu->attention_state_bytes(2, 37, 4), unfused_state(*this, 2, 37, 4));
}

// flash_attention on: bf16 runs the fused kernels for head sizes 16..128 (state: the
// rows' logsumexp) and the unfused fallback for others (12 here); fp32 keeps the
// unfused path. T = 1, tails of a 64-row tile, one full tile, several tiles; then
// grouped key/value heads (two query heads per key/value head, and four on one).
TEST_P(CudaOpsModelTest, FlashAttentionForwardAndBackward) {
  gpu = std::make_unique<CudaOps>(0, dtype(), /*fuse_epilogues=*/true, /*flash_attention=*/true);
  EXPECT_EQ(gpu->name().find("fused attention") != std::string::npos, bf16()) << gpu->name();
  const int B = 2;
  for (int hs : {16, 32, 64, 96, 128, 12}) {
    for (int T : {1, 37, 64, 200}) {
      const int NH = hs == 128 ? 2 : (hs == 64 ? 3 : 4);
      SCOPED_TRACE("hs=" + std::to_string(hs) + " T=" + std::to_string(T));
      const std::size_t state =
          bf16() ? std::size_t(B) * NH * T * sizeof(float) : unfused_state(*this, B, T, NH);
      check_attention(*this, B, T, NH * hs, NH, NH, state);
    }
  }
  for (int hs : {64, 12})
    for (int NKV : {2, 1}) {
      const int NH = 4, T = 200;
      SCOPED_TRACE("hs=" + std::to_string(hs) + " NKV=" + std::to_string(NKV));
      const std::size_t state =
          bf16() ? std::size_t(B) * NH * T * sizeof(float) : unfused_state(*this, B, T, NH);
      check_attention(*this, B, T, NH * hs, NH, NKV, state);
    }
  SCOPED_TRACE("qkv and dout without 16-byte alignment");
  check_attention(*this, B, 37, 2 * 64, 2, 2,
                  bf16() ? std::size_t(B) * 2 * 37 * sizeof(float) : unfused_state(*this, B, 37, 2),
                  /*skip=*/1);
}

// The fused kernels give the same bits every run (no atomics), with as many key/value
// heads as query heads and with fewer.
TEST_P(CudaOpsModelTest, FlashAttentionIsDeterministic) {
  if (!bf16()) GTEST_SKIP() << "the fused kernels run in bf16 only";
  gpu = std::make_unique<CudaOps>(0, dtype(), /*fuse_epilogues=*/true, /*flash_attention=*/true);
  for (const auto& [NH, NKV] : {std::pair{2, 2}, std::pair{4, 2}}) {
    SCOPED_TRACE("NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
    const int B = 2, T = 200, C = NH * 64;
    const std::size_t N = std::size_t(B) * T, n_qkv = N * (C + 2 * 64 * NKV);
    Buffer qkv = act(input(n_qkv, 1)), dout = act(input(N * C, 2)),
           state(*gpu, gpu->attention_state_bytes(B, T, NH));
    std::vector<float> first_out, first_dqkv;
    for (int run = 0; run < 2; ++run) {
      Buffer out = act_nan(N * C), dqkv = act_nan(n_qkv);
      gpu->attention_forward(out.act(), state.get(), qkv.act(), B, T, C, NH, NKV);
      gpu->attention_backward(dqkv.act(), dout.act(), qkv.act(), out.act(), state.get(), B, T, C,
                              NH, NKV);
      std::vector<float> o = read_act(out, N * C), d = read_act(dqkv, n_qkv);
      if (run == 0) {
        first_out = std::move(o);
        first_dqkv = std::move(d);
        continue;
      }
      // memcmp: NaN-safe, bit for bit (the bf16 -> fp32 widening is exact).
      EXPECT_EQ(std::memcmp(o.data(), first_out.data(), o.size() * sizeof(float)), 0) << "out";
      EXPECT_EQ(std::memcmp(d.data(), first_dqkv.data(), d.size() * sizeof(float)), 0) << "dqkv";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpsModelTest, ::testing::Values(DType::F32, DType::BF16),
                         dtype_param_name);

}  // namespace
}  // namespace pptrain::ops::testing
