// The CUDA backend against the CPU reference, for fp32 and bf16 compute: attention
// forward and backward (unfused, and fused with flash_attention on), the
// vocab-parallel embedding, cross-entropy and its three vocab-parallel phases. Small
// odd shapes. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/random.hpp"
#include "cuda_ops_fixture.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace pptrain::ops::testing {
namespace {

class CudaOpsModelTest : public CudaOpsTest {};

constexpr int kB = 2, kT = 37, kC = 48, kNH = 4, kV = 101, kVp = 128;
constexpr int kN = kB * kT;

// n ids in [0, bound), a pure function of seed.
std::vector<int32_t> ids(std::size_t n, uint64_t seed, int bound) {
  std::vector<int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = int32_t(uniform01(hash_words(seed, i)) * bound);
  return v;
}

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

// Attention forward and backward of shape (B, T, C, NH) on t.gpu against the CPU; the
// GPU's state is expected to take state_bytes. qkv and dout sit `skip` elements into
// their buffers.
void check_attention(CudaOpsModelTest& t, int B, int T, int C, int NH, std::size_t state_bytes,
                     int skip = 0) {
  const std::size_t N = std::size_t(B) * T;
  Ops& gpu = *t.gpu;
  Ops& cpu = *t.cpu;
  const DType dt = t.dtype();
  EXPECT_EQ(gpu.attention_state_bytes(B, T, NH), state_bytes);
  const auto qkv = t.input(N * 3 * C, 1), dout = t.input(N * C, 2);
  Buffer qkv_buf = act_at(t, qkv, skip), dout_buf = act_at(t, dout, skip),
         dout_fwd = t.act_nan(N * C), ddqkv = t.act_nan(qkv.size()), state(gpu, state_bytes);
  const Act* dqkv_in = advance(qkv_buf.act(), skip, dt);
  const Act* ddout = advance(dout_buf.act(), skip, dt);
  std::vector<float> out(N * C), dqkv(qkv.size()),
      cstate(cpu.attention_state_bytes(B, T, NH) / sizeof(float));
  gpu.attention_forward(dout_fwd.act(), state.get(), dqkv_in, B, T, C, NH);
  cpu.attention_forward(ha(out), cstate.data(), ha(qkv), B, T, C, NH);
  EXPECT_TRUE(all_close(t.read_act(dout_fwd, out.size()), out, t.tol(2e-2))) << "out";
  gpu.attention_backward(ddqkv.act(), ddout, dqkv_in, dout_fwd.act(), state.get(), B, T, C, NH);
  cpu.attention_backward(ha(dqkv), ha(dout), ha(qkv), ha(out), cstate.data(), B, T, C, NH);
  // bf16: probabilities, scores and their gradients are all rounded on the way.
  EXPECT_TRUE(all_close(t.read_act(ddqkv, dqkv.size()), dqkv, t.tol(3e-2))) << "dqkv";
}

TEST_P(CudaOpsModelTest, AttentionForwardAndBackward) {
  check_attention(*this, kB, kT, kC, kNH, unfused_state(*this, kB, kT, kNH));
}

// T and head size multiples of 8: the kernels' 16-byte paths.
TEST_P(CudaOpsModelTest, AttentionForwardAndBackwardWidePaths) {
  check_attention(*this, 2, 64, 64, 4, unfused_state(*this, 2, 64, 4));
}

// flash_attention on: bf16 runs the fused kernels for head sizes 16..128 (state: the
// rows' logsumexp) and the unfused fallback for others (12 here); fp32 keeps the
// unfused path. T = 1, tails of a 64-row tile, one full tile, several tiles.
TEST_P(CudaOpsModelTest, FlashAttentionForwardAndBackward) {
  gpu = std::make_unique<CudaOps>(0, dtype(), /*fuse_epilogues=*/true, /*flash_attention=*/true);
  EXPECT_EQ(gpu->name().find("fused attention") != std::string::npos, bf16()) << gpu->name();
  const int B = 2;
  for (int hs : {16, 32, 64, 128, 12}) {
    for (int T : {1, 37, 64, 200}) {
      const int NH = hs == 128 ? 2 : (hs == 64 ? 3 : 4);
      SCOPED_TRACE("hs=" + std::to_string(hs) + " T=" + std::to_string(T));
      const std::size_t state =
          bf16() ? std::size_t(B) * NH * T * sizeof(float) : unfused_state(*this, B, T, NH);
      check_attention(*this, B, T, NH * hs, NH, state);
    }
  }
  SCOPED_TRACE("qkv and dout without 16-byte alignment");
  check_attention(*this, B, 37, 2 * 64, 2,
                  bf16() ? std::size_t(B) * 2 * 37 * sizeof(float) : unfused_state(*this, B, 37, 2),
                  /*skip=*/1);
}

// The fused kernels give the same bits every run (no atomics).
TEST_P(CudaOpsModelTest, FlashAttentionIsDeterministic) {
  if (!bf16()) GTEST_SKIP() << "the fused kernels run in bf16 only";
  gpu = std::make_unique<CudaOps>(0, dtype(), /*fuse_epilogues=*/true, /*flash_attention=*/true);
  const int B = 2, T = 200, NH = 2, C = NH * 64;
  const std::size_t N = std::size_t(B) * T;
  Buffer qkv = act(input(N * 3 * C, 1)), dout = act(input(N * C, 2)),
         state(*gpu, gpu->attention_state_bytes(B, T, NH));
  std::vector<float> first_out, first_dqkv;
  for (int run = 0; run < 2; ++run) {
    Buffer out = act_nan(N * C), dqkv = act_nan(N * 3 * C);
    gpu->attention_forward(out.act(), state.get(), qkv.act(), B, T, C, NH);
    gpu->attention_backward(dqkv.act(), dout.act(), qkv.act(), out.act(), state.get(), B, T, C,
                            NH);
    std::vector<float> o = read_act(out, N * C), d = read_act(dqkv, N * 3 * C);
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

TEST_P(CudaOpsModelTest, VocabShardEmbeddingForwardAndBackward) {
  const int begin = 40, rows = 30;  // this shard holds token rows [40, 70)
  std::vector<int32_t> tokens = ids(kN, 1, kV);
  tokens[0] = begin, tokens[1] = begin + rows - 1, tokens[2] = begin + rows, tokens[3] = 0;
  tokens[5] = tokens[9] = tokens[40] = 55;  // a repeated token
  const auto wte = input(std::size_t(rows) * kC, 2), wpe = input(std::size_t(kT) * kC, 3),
             dout = input(std::size_t(kN) * kC, 4);
  Buffer dtok = i32(tokens), dwte_in = act(wte), dwpe_in = act(wpe), ddout = act(dout);
  for (bool with_wpe : {true, false}) {
    std::vector<float> out(std::size_t(kN) * kC);
    Buffer dout_fwd = act_nan(out.size());
    gpu->embedding_forward(dout_fwd.act(), dtok.i32(), dwte_in.act(), begin, rows,
                           with_wpe ? dwpe_in.act() : nullptr, kB, kT, kC);
    cpu->embedding_forward(ha(out), tokens.data(), ha(wte), begin, rows,
                           with_wpe ? ha(wpe) : nullptr, kB, kT, kC);
    EXPECT_TRUE(all_close(read_act(dout_fwd, out.size()), out, tol(1e-2)))
        << "forward, wpe=" << with_wpe;

    std::vector<float> dwte = randn(wte.size(), 5), dwpe = randn(wpe.size(), 6);
    Buffer ddwte = f32(dwte), ddwpe = f32(dwpe);
    gpu->embedding_backward(ddwte.f32(), with_wpe ? ddwpe.f32() : nullptr, ddout.act(), dtok.i32(),
                            begin, rows, kB, kT, kC);
    cpu->embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, ha(dout), tokens.data(),
                            begin, rows, kB, kT, kC);
    EXPECT_TRUE(all_close(read_f32(ddwte, dwte.size()), dwte, tol(1e-4)))
        << "dwte, wpe=" << with_wpe;
    EXPECT_TRUE(all_close(read_f32(ddwpe, dwpe.size()), dwpe, tol(1e-4)))
        << "dwpe (untouched without wpe), wpe=" << with_wpe;
  }
}

TEST_P(CudaOpsModelTest, CrossEntropyLossGradientAndAliasing) {
  const auto logits = input(std::size_t(kN) * kVp, 1, 2.0f);
  const std::vector<int32_t> targets = ids(kN, 2, kV);
  const float dloss = 1.0f / kN;
  std::vector<float> losses(kN), dlogits(logits.size());
  cpu->cross_entropy(losses.data(), ha(dlogits), ha(logits), targets.data(), kN, kV, kVp, dloss);
  Buffer dlog = act(logits), dtgt = i32(targets), dlosses = f32_nan(kN),
         ddlog = act_nan(logits.size());
  gpu->cross_entropy(dlosses.f32(), ddlog.act(), dlog.act(), dtgt.i32(), kN, kV, kVp, dloss);
  EXPECT_TRUE(all_close(read_f32(dlosses, kN), losses, tol(1e-4))) << "losses";
  EXPECT_TRUE(all_close(read_act(ddlog, logits.size()), dlogits, tol(1e-2))) << "dlogits";

  Buffer loss_only = f32_nan(kN);  // dlogits == nullptr: the loss alone
  gpu->cross_entropy(loss_only.f32(), nullptr, dlog.act(), dtgt.i32(), kN, kV, kVp, dloss);
  EXPECT_TRUE(all_close(read_f32(loss_only, kN), losses, tol(1e-4))) << "loss only";

  Buffer in_place = f32_nan(kN);  // dlogits aliases logits
  gpu->cross_entropy(in_place.f32(), dlog.act(), dlog.act(), dtgt.i32(), kN, kV, kVp, dloss);
  EXPECT_TRUE(all_close(read_f32(in_place, kN), losses, tol(1e-4))) << "in-place losses";
  EXPECT_TRUE(all_close(read_act(dlog, logits.size()), dlogits, tol(1e-2))) << "in-place dlogits";
}

// rowmax values agree (equal when -inf: a shard without real columns).
::testing::AssertionResult same_rowmax(const std::vector<float>& got,
                                       const std::vector<float>& want) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i] || std::fabs(got[i] - want[i]) <= 1e-6f * std::fabs(want[i])))
      return ::testing::AssertionFailure() << "row " << i << ": " << got[i] << " vs " << want[i];
  return ::testing::AssertionSuccess();
}

TEST_P(CudaOpsModelTest, VocabParallelCrossEntropyPhases) {
  // Four column shards of 32; with V = 60 the last two hold padding only.
  const int shards = 4, Vl = kVp / shards;
  for (int V : {kV, 60}) {
    const auto logits = input(std::size_t(kN) * kVp, 3, 2.0f);
    const std::vector<int32_t> targets = ids(kN, 4, V);
    Buffer dtgt = i32(targets);
    std::vector<std::vector<float>> part(shards, std::vector<float>(std::size_t(kN) * Vl));
    for (int s = 0; s < shards; ++s)
      for (int n = 0; n < kN; ++n)
        std::copy_n(&logits[std::size_t(n) * kVp + s * Vl], Vl, &part[s][std::size_t(n) * Vl]);
    // Phase 1 per shard, then the MAX all-reduce on the host (from the CPU's values).
    std::vector<float> rowmax(kN, -std::numeric_limits<float>::infinity());
    for (int s = 0; s < shards; ++s) {
      std::vector<float> want(kN);
      cpu->ce_row_max(want.data(), ha(part[s]), kN, Vl, s * Vl, V);
      Buffer dpart = act(part[s]), got = f32_nan(kN);
      gpu->ce_row_max(got.f32(), dpart.act(), kN, Vl, s * Vl, V);
      EXPECT_TRUE(same_rowmax(read_f32(got, kN), want)) << "rowmax, V=" << V << " shard " << s;
      for (int n = 0; n < kN; ++n) rowmax[n] = std::max(rowmax[n], want[n]);
    }
    // Phase 2 per shard, then the SUM all-reduce.
    std::vector<float> stats(2 * kN, 0.0f);
    Buffer drowmax = f32(rowmax);
    for (int s = 0; s < shards; ++s) {
      std::vector<float> want(2 * kN);
      cpu->ce_partial_sums(want.data(), ha(part[s]), rowmax.data(), targets.data(), kN, Vl, s * Vl,
                           V);
      Buffer dpart = act(part[s]), got = f32_nan(2 * kN);
      gpu->ce_partial_sums(got.f32(), dpart.act(), drowmax.f32(), dtgt.i32(), kN, Vl, s * Vl, V);
      EXPECT_TRUE(all_close(read_f32(got, 2 * kN), want, tol(1e-4)))
          << "stats, V=" << V << " shard " << s;
      for (int i = 0; i < 2 * kN; ++i) stats[i] += want[i];
    }
    // Phase 3 per shard.
    Buffer dstats = f32(stats);
    for (int s = 0; s < shards; ++s) {
      std::vector<float> losses(kN), dl(part[s].size());
      cpu->ce_finish(losses.data(), ha(dl), ha(part[s]), rowmax.data(), stats.data(),
                     targets.data(), kN, Vl, s * Vl, V, 0.5f);
      Buffer dpart = act(part[s]), glosses = f32_nan(kN), gdl = act_nan(dl.size());
      gpu->ce_finish(glosses.f32(), gdl.act(), dpart.act(), drowmax.f32(), dstats.f32(), dtgt.i32(),
                     kN, Vl, s * Vl, V, 0.5f);
      EXPECT_TRUE(all_close(read_f32(glosses, kN), losses, tol(1e-4)))
          << "losses, V=" << V << " shard " << s;
      EXPECT_TRUE(all_close(read_act(gdl, dl.size()), dl, tol(1e-2)))
          << "dlogits, V=" << V << " shard " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpsModelTest, ::testing::Values(DType::F32, DType::BF16),
                         dtype_param_name);

}  // namespace
}  // namespace pptrain::ops::testing
