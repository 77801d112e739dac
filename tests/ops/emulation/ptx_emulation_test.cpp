// The emulator's PTX instructions (emulator_ptx.hpp) against their documented semantics:
// mma.sync's fragment layouts, ldmatrix's in each of its shapes and with .trans, the
// groups of cp.async and the poison a copy holds until its wait, and the faults a GPU
// raises (misaligned addresses, a cp.async into global memory); and the counters.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulation_test_util.hpp"
#include "emulator_counters.hpp"
#include "ptx_test_kernels.hpp"

namespace pptrain::emulation_test {
namespace {

namespace pt = emulator_ptx_test;

// c[i][j] + sum_k a[i][k] b[k][j], in double (exact for bf16 products of a few terms).
double product(const std::vector<float>& a, const std::vector<float>& b, int n, int i, int j) {
  double s = 0.0;
  for (int k = 0; k < 16; ++k) s += double(a[i * 16 + k]) * double(b[k * n + j]);
  return s;
}

TEST(EmulatedPtx, MmaFollowsTheFragmentLayouts) {
  const std::vector<float> a = rounded<bf16>(randn(16 * 16, 1)), b = rounded<bf16>(randn(16 * 8, 2)),
                           c = randn(16 * 8, 3);
  Device<bf16> da(a), db(b);
  Device<float> dc(c), dd(std::vector<float>(16 * 8, NAN));
  pt::mma_from_layout(dd.get(), da.get(), db.get(), dc.get());
  const std::vector<float> d = dd.read();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j)
      EXPECT_NEAR(d[i * 8 + j], c[i * 8 + j] + product(a, b, 8, i, j), 1e-4) << i << "," << j;
}

TEST(EmulatedPtx, LdmatrixShapesFeedTheProduct) {
  const std::vector<float> a = rounded<bf16>(randn(256, 4)), b = rounded<bf16>(randn(256, 5));
  Device<bf16> da(a), db(b);
  for (int route = 0; route < 3; ++route) {
    Device<float> dd(std::vector<float>(256, NAN));
    pt::ldmatrix_product(dd.get(), da.get(), db.get(), route);
    const std::vector<float> d = dd.read();
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j)
        EXPECT_NEAR(d[i * 16 + j], product(a, b, 16, i, j), 1e-4) << route << ": " << i << "," << j;
  }
}

// The counters see the kernel's plain loads and stores (through GCC's instrumentation)
// and what ldmatrix moves: a and b read (512 bytes each), staged in shared memory (1,024
// bytes written), read back by two .x4 ldmatrix (1,024 bytes), two mma.sync, d written.
TEST(EmulatedPtx, CountersSeeEveryByteAndInstruction) {
#if defined(__GNUC__) && !defined(__clang__)
  // Device allocations (the test's Device arrays are host memory, which is not counted).
  std::vector<bf16> ab(512, __float2bfloat16_rn(1.0f));
  void *a = nullptr, *d = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 512 * sizeof(bf16)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d, 256 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(a, ab.data(), 512 * sizeof(bf16), cudaMemcpyHostToDevice), cudaSuccess);
  const auto before = pptrain_emu::counters::totals();
  pt::ldmatrix_product(static_cast<float*>(d), static_cast<bf16*>(a), static_cast<bf16*>(a) + 256,
                       0);
  const auto c = pptrain_emu::counters::totals();
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(c.launches - before.launches, 1u);
  EXPECT_EQ(c.mma - before.mma, 2u);
  EXPECT_EQ(c.global_read - before.global_read, 1024u);
  EXPECT_EQ(c.global_written - before.global_written, 1024u);
  EXPECT_EQ(c.shared_written - before.shared_written, 1024u);
  EXPECT_EQ(c.shared_read - before.shared_read, 1024u);
#else
  GTEST_SKIP() << "the counters see kernel accesses only in a GCC build";
#endif
}

TEST(EmulatedPtx, CpAsyncLandsAtTheWaitOfItsGroup) {
  std::vector<float> src(256);
  for (int i = 0; i < 256; ++i) src[i] = float(i + 1);
  Device<float> dsrc(src), dout(std::vector<float>(32 * 24, 0.0f));
  pt::cp_async_groups(dout.get(), dsrc.get());
  const std::vector<float> out = dout.read();
  for (int i = 0; i < 32; ++i)
    for (int k = 0; k < 8; ++k) {
      const float* o = out.data() + 24 * i;
      const float copied = k < 4 ? src[8 * i + k] : 0.0f;  // the second copy fills zeros
      EXPECT_TRUE(std::isnan(o[k])) << i << "," << k << ": read before any wait";
      if (k < 4)
        EXPECT_EQ(o[8 + k], copied) << i << "," << k << ": group 1 after wait_group 1";
      else
        EXPECT_TRUE(std::isnan(o[8 + k])) << i << "," << k << ": group 2 still in flight";
      EXPECT_EQ(o[16 + k], copied) << i << "," << k << ": after wait_group 0";
    }
}

TEST(EmulatedPtx, MisalignedAndMisplacedAccessesFault) {
  Device<float> src(std::vector<float>(16, 1.0f)), dst(std::vector<float>(16, 0.0f));
  EXPECT_NE(thrown([&] { pt::cp_async_misaligned(src.get()); }).find("not 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(thrown([&] { pt::cp_async_to_global(dst.get(), src.get()); }).find("not in shared"),
            std::string::npos);
  EXPECT_NE(thrown([] { pt::ldmatrix_misaligned(); }).find("lane 5's row is not 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(thrown([&] { pt::vector_load_misaligned(dst.get(), src.get()); })
                .find("not 16-byte aligned"),
            std::string::npos);
}

}  // namespace
}  // namespace pptrain::emulation_test
