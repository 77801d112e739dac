// The CUDA backend against the CPU reference, for fp32 and bf16 compute: attention
// forward and backward, the vocab-parallel embedding, cross-entropy and its three
// vocab-parallel phases. Small odd shapes. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "cuda_ops_fixture.hpp"

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

// Attention forward and backward of shape (B, T, C, NH) against the CPU.
void check_attention(CudaOpsModelTest& t, int B, int T, int C, int NH) {
  const std::size_t N = std::size_t(B) * T;
  Ops& gpu = *t.gpu;
  Ops& cpu = *t.cpu;
  EXPECT_EQ(gpu.attention_state_bytes(B, T, NH), std::size_t(B) * NH * T * T * dtype_size(t.dtype()));
  const auto qkv = t.input(N * 3 * C, 1), dout = t.input(N * C, 2);
  Buffer dqkv_in = t.act(qkv), ddout = t.act(dout), dout_fwd = t.act_nan(N * C),
         ddqkv = t.act_nan(qkv.size()), state(gpu, gpu.attention_state_bytes(B, T, NH));
  std::vector<float> out(N * C), dqkv(qkv.size()),
      cstate(cpu.attention_state_bytes(B, T, NH) / sizeof(float));
  gpu.attention_forward(dout_fwd.act(), state.get(), dqkv_in.act(), B, T, C, NH);
  cpu.attention_forward(ha(out), cstate.data(), ha(qkv), B, T, C, NH);
  EXPECT_TRUE(all_close(t.read_act(dout_fwd, out.size()), out, t.tol(2e-2))) << "out";
  gpu.attention_backward(ddqkv.act(), ddout.act(), dqkv_in.act(), state.get(), B, T, C, NH);
  cpu.attention_backward(ha(dqkv), ha(dout), ha(qkv), cstate.data(), B, T, C, NH);
  // bf16: probabilities, scores and their gradients are all rounded on the way.
  EXPECT_TRUE(all_close(t.read_act(ddqkv, dqkv.size()), dqkv, t.tol(3e-2))) << "dqkv";
}

TEST_P(CudaOpsModelTest, AttentionForwardAndBackward) { check_attention(*this, kB, kT, kC, kNH); }

// T and head size multiples of 8: the kernels' 16-byte paths.
TEST_P(CudaOpsModelTest, AttentionForwardAndBackwardWidePaths) {
  check_attention(*this, 2, 64, 64, 4);
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
