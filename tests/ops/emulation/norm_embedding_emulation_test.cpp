// The LayerNorm (layernorm.cu), RMSNorm (llama.cu) and embedding (embedding.cu) kernels
// under the CUDA emulator against the CPU backend (RMSNorm's one pass against its two
// kernels), for float and bf16 elements, on shapes that take the 16-byte packs and
// shapes (or pointers) that do not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "emulated_kernels.hpp"
#include "emulation_test_util.hpp"
#include "emulator_counters.hpp"
#include "ops/cpu/cpu_ops.hpp"
#include "plan/kernel_traffic.hpp"

namespace pptrain::emulation_test {
namespace {

template <typename T>
class EmulatedNorm : public ::testing::Test {
 protected:
  ops::CpuOps cpu{1};
};
TYPED_TEST_SUITE(EmulatedNorm, ElementTypes, ElementTypeNames);

template <typename T>
using EmulatedEmbedding = EmulatedNorm<T>;
TYPED_TEST_SUITE(EmulatedEmbedding, ElementTypes, ElementTypeNames);

// (N, C, skew): odd C (scalar), C that takes the packs, rows past one block of 8, more
// than one 64-row chunk for the weight gradient, a misaligned input, rows shorter than a
// warp.
constexpr int kNormShapes[][3] = {{11, 37, 0}, {9, 64, 0}, {130, 72, 0}, {5, 64, 1}, {6, 5, 0}};

TYPED_TEST(EmulatedNorm, LayerNormForwardMatchesCpu) {
  using T = TypeParam;
  for (const auto& [N, C, skew] : kNormShapes) {
    const std::size_t n = std::size_t(N) * C;
    const std::vector<float> x = rounded<T>(randn(n, 1, 2.0f)), w = rounded<T>(randn(C, 2)),
                             b = rounded<T>(randn(C, 3));
    Device<T> dx(x, skew), dw(w), db(b), out(n);
    Device<float> mean(N), rstd(N);
    kern::layernorm_forward<T>(out.get(), mean.get(), rstd.get(), dx.get(), dw.get(), db.get(), N,
                               C, nullptr);
    std::vector<float> want(n), want_mean(N), want_rstd(N);
    this->cpu.layernorm_forward(want.data(), want_mean.data(), want_rstd.data(), x.data(), w.data(),
                                b.data(), N, C);
    EXPECT_TRUE(all_close(out.read(), want, tol<T>(1e-5))) << N << "x" << C;
    EXPECT_TRUE(all_close(mean.read(), want_mean, 1e-5)) << N << "x" << C;
    EXPECT_TRUE(all_close(rstd.read(), want_rstd, 1e-5)) << N << "x" << C;
  }
}

TYPED_TEST(EmulatedNorm, LayerNormBackwardMatchesCpu) {
  using T = TypeParam;
  for (const auto& [N, C, skew] : kNormShapes) {
    const std::size_t n = std::size_t(N) * C;
    const std::vector<float> x = rounded<T>(randn(n, 4, 2.0f)), w = rounded<T>(randn(C, 5)),
                             b = rounded<T>(randn(C, 6)), dout = rounded<T>(randn(n, 7));
    std::vector<float> y(n), mean(N), rstd(N);
    this->cpu.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                                C);
    // The input gradient accumulates into dinp; the weight gradients into dw, db.
    std::vector<float> dinp = rounded<T>(randn(n, 8)), dw = randn(C, 9), db = randn(C, 10);
    Device<T> ddinp(dinp, skew), ddout(dout, skew), dx(x, skew), dwt(w);
    Device<float> dmean(mean), drstd(rstd), ddw(dw), ddb(db);
    Device<float> scratch(kern::layernorm_backward_weight_scratch_floats(N, C));
    kern::layernorm_backward_input<T>(ddinp.get(), ddinp.get(), ddout.get(), dx.get(), dwt.get(),
                                      dmean.get(), drstd.get(), N, C, nullptr);
    kern::layernorm_backward_weight<T>(ddw.get(), ddb.get(), ddout.get(), dx.get(), dmean.get(),
                                       drstd.get(), N, C, scratch.get(), nullptr);
    this->cpu.layernorm_backward_input(dinp.data(), dinp.data(), dout.data(), x.data(), w.data(),
                                       mean.data(), rstd.data(), N, C);
    this->cpu.layernorm_backward_weight(dw.data(), db.data(), dout.data(), x.data(), mean.data(),
                                        rstd.data(), N, C);
    EXPECT_TRUE(all_close(ddinp.read(), dinp, tol<T>(1e-5))) << N << "x" << C;
    EXPECT_TRUE(all_close(ddw.read(), dw, 1e-5)) << N << "x" << C;
    EXPECT_TRUE(all_close(ddb.read(), db, 1e-5)) << N << "x" << C;
  }
}

// The shared memory a block may opt into (what the one-pass norm backwards may use).
int opt_in_shared_memory() {
  int bytes = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  return bytes;
}

// The one-pass backward (B and W together) against the two kernels, bit for bit: the
// input gradient in place and apart, over the same shapes.
TYPED_TEST(EmulatedNorm, LayerNormBackwardInOnePassEqualsTheTwoKernels) {
  using T = TypeParam;
  const int max_shared = opt_in_shared_memory();
  for (const auto& [N, C, skew] : kNormShapes)
    for (const bool in_place : {true, false}) {
      const std::size_t n = std::size_t(N) * C;
      const std::vector<float> x = rounded<T>(randn(n, 4, 2.0f)), w = rounded<T>(randn(C, 5)),
                               b = rounded<T>(randn(C, 6)), dout = rounded<T>(randn(n, 7)),
                               dres = rounded<T>(randn(n, 8)), dw = randn(C, 9), db = randn(C, 10);
      std::vector<float> y(n), mean(N), rstd(N);
      this->cpu.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                  b.data(), N, C);
      Device<T> ddout(dout, skew), dx(x, skew), dwt(w), dres1(dres, skew), dres2(dres, skew);
      Device<T> dinp1(n, skew), dinp2(n, skew);
      Device<float> dmean(mean), drstd(rstd), dw1(dw), db1(db), dw2(dw), db2(db);
      Device<float> scratch(kern::layernorm_backward_weight_scratch_floats(N, C));
      T* out1 = in_place ? dres1.get() : dinp1.get();
      T* out2 = in_place ? dres2.get() : dinp2.get();
      kern::layernorm_backward_input<T>(out1, dres1.get(), ddout.get(), dx.get(), dwt.get(),
                                        dmean.get(), drstd.get(), N, C, nullptr);
      kern::layernorm_backward_weight<T>(dw1.get(), db1.get(), ddout.get(), dx.get(), dmean.get(),
                                         drstd.get(), N, C, scratch.get(), nullptr);
      kern::layernorm_backward<T>(out2, dres2.get(), ddout.get(), dx.get(), dwt.get(),
                                  dmean.get(), drstd.get(), dw2.get(), db2.get(), N, C,
                                  scratch.get(), max_shared, nullptr);
      const Device<T>& got1 = in_place ? dres1 : dinp1;
      const Device<T>& got2 = in_place ? dres2 : dinp2;
      EXPECT_EQ(got2.read(), got1.read()) << N << "x" << C << (in_place ? ", in place" : "");
      EXPECT_EQ(dw2.read(), dw1.read()) << N << "x" << C;
      EXPECT_EQ(db2.read(), db1.read()) << N << "x" << C;
    }
}

// RMSNorm's one pass against its two kernels, bit for bit, as LayerNorm's.
TYPED_TEST(EmulatedNorm, RmsNormBackwardInOnePassEqualsTheTwoKernels) {
  using T = TypeParam;
  const int max_shared = opt_in_shared_memory();
  for (const auto& [N, C, skew] : kNormShapes)
    for (const bool in_place : {true, false}) {
      const std::size_t n = std::size_t(N) * C;
      const std::vector<float> x = rounded<T>(randn(n, 4, 2.0f)), w = rounded<T>(randn(C, 5)),
                               dout = rounded<T>(randn(n, 7)), dres = rounded<T>(randn(n, 8)),
                               dw = randn(C, 9);
      std::vector<float> y(n), rstd(N);
      this->cpu.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
      Device<T> ddout(dout, skew), dx(x, skew), dwt(w), dres1(dres, skew), dres2(dres, skew);
      Device<T> dinp1(n, skew), dinp2(n, skew);
      Device<float> drstd(rstd), dw1(dw), dw2(dw);
      Device<float> scratch(kern::rmsnorm_backward_weight_scratch_floats(N, C));
      T* out1 = in_place ? dres1.get() : dinp1.get();
      T* out2 = in_place ? dres2.get() : dinp2.get();
      kern::rmsnorm_backward_input<T>(out1, dres1.get(), ddout.get(), dx.get(), dwt.get(),
                                      drstd.get(), N, C, nullptr);
      kern::rmsnorm_backward_weight<T>(dw1.get(), ddout.get(), dx.get(), drstd.get(), N, C,
                                       scratch.get(), nullptr);
      kern::rmsnorm_backward<T>(out2, dres2.get(), ddout.get(), dx.get(), dwt.get(), drstd.get(),
                                dw2.get(), N, C, scratch.get(), max_shared, nullptr);
      const Device<T>& got1 = in_place ? dres1 : dinp1;
      const Device<T>& got2 = in_place ? dres2 : dinp2;
      EXPECT_EQ(got2.read(), got1.read()) << N << "x" << C << (in_place ? ", in place" : "");
      EXPECT_EQ(dw2.read(), dw1.read()) << N << "x" << C;
    }
}

// Tokens of B*T positions: repeats, and ids below and past the shard [begin, begin+rows).
std::vector<int32_t> make_tokens(int BT, int begin, int rows) {
  std::vector<int32_t> t(BT);
  for (int i = 0; i < BT; ++i) t[i] = (i * 7 + i / 3) % (begin + rows + 4);
  if (BT > 3) t[1] = t[2] = t[BT - 1] = begin + rows / 2;  // one row three times
  return t;
}

// (B, T, C, vocab_rows, skew): one shard of the dwte kernel; C that takes the packs;
// several shards, several column slices (C 300 misaligned: 256-column slices) and more
// positions than a tile of 256; more tiles than a word of the tile bits holds (32).
constexpr int kEmbeddingShapes[][5] = {{2, 7, 37, 13, 0},    {2, 5, 64, 13, 0},
                                       {3, 100, 300, 150, 1}, {2, 9, 64, 150, 0},
                                       {2, 4200, 8, 40, 0}};

TYPED_TEST(EmulatedEmbedding, ForwardMatchesCpu) {
  using T = TypeParam;
  constexpr int kBegin = 5;
  for (const auto& [B, Tn, C, rows, skew] : kEmbeddingShapes)
    for (bool with_wpe : {true, false}) {
      const int BT = B * Tn;
      const std::vector<int32_t> tokens = make_tokens(BT, kBegin, rows);
      const std::vector<float> wte = rounded<T>(randn(std::size_t(rows) * C, 1)),
                               wpe = rounded<T>(randn(std::size_t(Tn) * C, 2));
      Device<int32_t> dtok(tokens);
      Device<T> dwte(wte, skew), dwpe(wpe, skew), out(std::size_t(BT) * C, skew);
      kern::embedding_forward<T>(out.get(), dtok.get(), dwte.get(), kBegin, rows,
                                 with_wpe ? dwpe.get() : nullptr, B, Tn, C, nullptr);
      std::vector<float> want(std::size_t(BT) * C);
      this->cpu.embedding_forward(want.data(), tokens.data(), wte.data(), kBegin, rows,
                                  with_wpe ? wpe.data() : nullptr, B, Tn, C);
      EXPECT_TRUE(all_close(out.read(), rounded<T>(want), 0.0)) << B << "x" << Tn << "x" << C;
    }
}

TYPED_TEST(EmulatedEmbedding, BackwardAddsInPositionOrderLikeTheCpu) {
  using T = TypeParam;
  constexpr int kBegin = 5;
  for (const auto& [B, Tn, C, rows, skew] : kEmbeddingShapes)
    for (bool with_wpe : {true, false}) {
      const int BT = B * Tn;
      const std::vector<int32_t> tokens = make_tokens(BT, kBegin, rows);
      const std::vector<float> dout = rounded<T>(randn(std::size_t(BT) * C, 3));
      std::vector<float> dwte = randn(std::size_t(rows) * C, 4),
                         dwpe = randn(std::size_t(Tn) * C, 5);
      Device<int32_t> dtok(tokens);
      Device<T> ddout(dout, skew);
      Device<float> ddwte(dwte, skew), ddwpe(dwpe, skew);
      Device<float> scratch(ops::cuda_embedding_scratch_bytes(rows, BT) / 4);  // not zeroed
      kern::embedding_backward<T>(ddwte.get(), with_wpe ? ddwpe.get() : nullptr, ddout.get(),
                                  dtok.get(), kBegin, rows, B, Tn, C, scratch.get(), nullptr);
      this->cpu.embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                                   tokens.data(), kBegin, rows, B, Tn, C);
      // fp32 sums in the CPU's order: the same bits.
      EXPECT_TRUE(all_close(ddwte.read(), dwte, 0.0)) << B << "x" << Tn << "x" << C;
      EXPECT_TRUE(all_close(ddwpe.read(), dwpe, 0.0)) << B << "x" << Tn << "x" << C;
    }
}

// A device allocation holding `host`'s values (the counters see device memory only).
template <typename T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}

// What the table gradient's kernel reads and writes is the planner's model of it
// (plan/kernel_traffic.hpp) for the tokens it is given: (B, T, C, vocab_rows) with one
// column slice and several, one shard and several, repeated tokens and tokens of other
// shards.
TYPED_TEST(EmulatedEmbedding, TableGradientTrafficIsThePlannersModel) {
#if defined(__GNUC__) && !defined(__clang__)
  using T = TypeParam;
  constexpr int kBegin = 5;
  constexpr int kShapes[][4] = {{2, 5, 64, 13},    {3, 100, 300, 150}, {2, 9, 64, 150},
                                {2, 40, 1100, 70}, {2, 4200, 8, 40}};
  for (const auto& [B, Tn, C, rows] : kShapes) {
    const int BT = B * Tn;
    const std::vector<int32_t> tokens = make_tokens(BT, kBegin, rows);
    std::vector<T> dout(std::size_t(BT) * C);
    for (std::size_t i = 0; i < dout.size(); ++i) {
      const float v = float(i % 7) - 3.0f;
      if constexpr (std::is_same_v<T, bf16>) dout[i] = __float2bfloat16_rn(v);
      else dout[i] = v;
    }
    int32_t* dtok = device_copy(tokens);
    T* ddout = device_copy(dout);
    float* ddwte = device_copy(std::vector<float>(std::size_t(rows) * C, 1.0f));
    unsigned* bits = device_copy(std::vector<unsigned>(ops::cuda_embedding_scratch_bytes(rows, BT) / 4, ~0u));
    const auto before = pptrain_emu::counters::totals();
    kern::embedding_backward<T>(ddwte, nullptr, ddout, dtok, kBegin, rows, B, Tn, C, bits, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto after = pptrain_emu::counters::totals();
    for (void* p : {static_cast<void*>(dtok), static_cast<void*>(ddout), static_cast<void*>(ddwte),
                    static_cast<void*>(bits)})
      EXPECT_EQ(cudaFree(p), cudaSuccess);

    const int shard_rows = int(embedding_shard_rows(C));
    TokenCounts k;
    std::set<int> distinct, shards;
    std::set<std::pair<int, int>> shard_tiles;
    for (int i = 0; i < BT; ++i)
      if (const int t = tokens[std::size_t(i)]; t >= kBegin && t < kBegin + rows) {
        k.positions += 1;
        distinct.insert(t);
        shards.insert((t - kBegin) / shard_rows);
        shard_tiles.insert({(t - kBegin) / shard_rows, i / 256});
      }
    k.distinct = double(distinct.size()), k.shards = double(shards.size());
    for (const int s : shards) k.shard_rows += std::min(shard_rows, rows - s * shard_rows);
    for (const auto& [s, tile] : shard_tiles) k.tile_positions += std::min(256, BT - tile * 256);
    EmbeddingShape m;
    m.B = B, m.T = Tn, m.C = C, m.rows = rows, m.e = sizeof(T);
    const Traffic model = embedding_table_grad(m, k);
    EXPECT_EQ(double(after.launches - before.launches), model.launches) << B << "x" << Tn << "x" << C;
    EXPECT_EQ(double(after.global_read - before.global_read), model.read) << B << "x" << Tn << "x" << C;
    EXPECT_EQ(double(after.global_written - before.global_written), model.written)
        << B << "x" << Tn << "x" << C;
  }
#else
  GTEST_SKIP() << "the counters see kernel accesses only in a GCC build";
#endif
}

}  // namespace
}  // namespace pptrain::emulation_test
