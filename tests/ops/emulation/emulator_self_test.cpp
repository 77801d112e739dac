// The CUDA emulator's own checks: barrier and warp-collective semantics, indices,
// planted races caught through the schedule orders, poisoned shared memory and deferred
// wmma stores, planted faults reported (divergent barrier, exited lanes, deadlock,
// shared-memory overflow), launch-configuration errors, wmma and bf16 rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulation_test_util.hpp"
#include "self_test_kernels.hpp"

namespace pptrain::emulation_test {
namespace {

namespace st = emulator_selftest;

int count_nan(const std::vector<float>& v) {
  int n = 0;
  for (float x : v) n += std::isnan(x);
  return n;
}

TEST(Emulator, BarrierOrdersSharedMemoryInEveryScheduleOrder) {
  for (auto order : {pptrain_emu::ScheduleOrder::Ascending, pptrain_emu::ScheduleOrder::Descending,
                     pptrain_emu::ScheduleOrder::Alternate}) {
    const ScopedOrder scoped(order);
    for (int offset : {1, -1, 5}) {
      std::vector<float> out(3 * 96, NAN);
      st::neighbour_read(out.data(), 3, 96, offset, true);
      for (int i = 0; i < 3 * 96; ++i)
        ASSERT_EQ(out[i], float(((i % 96 + offset) % 96 + 96) % 96 + 1)) << i;
    }
  }
}

TEST(Emulator, MissingBarrierReadsPoison) {
  // Without the barrier, a thread that runs before the one whose value it reads sees
  // the poisoned shared memory: ascending order catches a read from a higher thread,
  // descending a read from a lower one, and the default alternates between blocks.
  auto nans = [](pptrain_emu::ScheduleOrder order, int offset) {
    const ScopedOrder scoped(order);
    std::vector<float> out(2 * 64, 0.0f);
    st::neighbour_read(out.data(), 2, 64, offset, false);
    return count_nan(out);
  };
  EXPECT_GT(nans(pptrain_emu::ScheduleOrder::Ascending, 1), 0);
  EXPECT_GT(nans(pptrain_emu::ScheduleOrder::Descending, -1), 0);
  EXPECT_GT(nans(pptrain_emu::ScheduleOrder::Alternate, 1), 0);
  EXPECT_GT(nans(pptrain_emu::ScheduleOrder::Alternate, -1), 0);
}

TEST(Emulator, MissingSyncwarpReadsPoison) {
  for (auto order :
       {pptrain_emu::ScheduleOrder::Ascending, pptrain_emu::ScheduleOrder::Descending}) {
    const ScopedOrder scoped(order);
    std::vector<float> with(32, NAN), without(32, 0.0f);
    st::warp_exchange(with.data(), true);
    st::warp_exchange(without.data(), false);
    for (int l = 0; l < 32; ++l) ASSERT_EQ(with[l], float(l ^ 1));
    EXPECT_EQ(count_nan(without), 16);  // one lane of each pair runs first
  }
}

TEST(Emulator, MissingBarrierBeforeReuseChangesWhatOthersRead) {
  // A thread runs ahead to the next barrier before the others run: without the barrier
  // between the reads and the overwrite, later threads read overwritten values.
  for (auto order :
       {pptrain_emu::ScheduleOrder::Ascending, pptrain_emu::ScheduleOrder::Descending}) {
    const ScopedOrder scoped(order);
    std::vector<float> with(64, NAN), without(64, NAN);
    st::reuse_shared(with.data(), true);
    st::reuse_shared(without.data(), false);
    int wrong = 0;
    for (int t = 0; t < 64; ++t) {
      ASSERT_EQ(with[t], float(63 - t + 100 + 63 - t)) << t;
      wrong += without[t] != with[t];
    }
    EXPECT_GT(wrong, 0);
  }
}

TEST(Emulator, WmmaStoreLandsAtTheWarpsNextSync) {
  std::vector<float> with(32, NAN), without(32, 0.0f);
  st::wmma_store_then_read(with.data(), true);
  st::wmma_store_then_read(without.data(), false);
  for (int l = 0; l < 32; ++l) ASSERT_EQ(with[l], 2.0f) << l;
  // The lane that runs first reads before the warp synchronises (at its exit): poison.
  EXPECT_EQ(count_nan(without), 1);
}

TEST(Emulator, ShufflesAndVotesFollowLanesOfTheLinearThreadIndex) {
  std::vector<unsigned> out(7 * 64, 12345u);
  st::shuffles(out.data());
  unsigned ballot = 0;
  for (unsigned l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (unsigned i = 0; i < 64; ++i) {
    const unsigned lane = i % 32;
    const unsigned* o = &out[7 * i];
    EXPECT_EQ(o[0], lane ^ 1u) << i;
    EXPECT_EQ(o[1], lane + 3 < 32 ? lane + 3 : lane) << i;
    EXPECT_EQ(o[2], lane >= 2 ? lane - 2 : lane) << i;
    EXPECT_EQ(o[3], 7u) << i;
    EXPECT_EQ(o[4], ballot) << i;
    EXPECT_EQ(o[5], 1u) << i;
    EXPECT_EQ(o[6], 1u) << i;
  }
}

TEST(Emulator, GridAndBlockIndices) {
  std::vector<int> out(6, -1);
  st::grid_indices(out.data());
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 2; ++x) EXPECT_EQ(out[y * 2 + x], x + 10 * y + 200 + 3000);
}

TEST(Emulator, PlantedFaultsAreReported) {
  EXPECT_NE(thrown(st::divergent_barrier).find("a barrier in divergent code"), std::string::npos)
      << thrown(st::divergent_barrier);
  EXPECT_NE(thrown(st::shuffle_with_exited_lanes).find("__shfl_xor_sync"), std::string::npos)
      << thrown(st::shuffle_with_exited_lanes);
  EXPECT_NE(thrown(st::deadlock).find("deadlock; threads waiting"), std::string::npos)
      << thrown(st::deadlock);
  EXPECT_NE(thrown(st::dynamic_shared_overflow).find("past the dynamic shared memory"),
            std::string::npos)
      << thrown(st::dynamic_shared_overflow);
  EXPECT_NE(thrown(st::static_shared_too_big).find("48 KiB"), std::string::npos)
      << thrown(st::static_shared_too_big);
  // The message names the kernel's launch site and the thread.
  EXPECT_NE(thrown(st::divergent_barrier).find("self_test_kernels.cu"), std::string::npos);
}

TEST(Emulator, SharedMemoryStartsPoisonedInEveryBlock) {
  std::vector<float> out(2, 0.0f);
  st::shared_memory_poisoned(out.data());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
}

TEST(Emulator, LaunchConfigurationErrors) {
  EXPECT_EQ(st::launch_status(1024, 1, 0, 0), cudaSuccess);
  EXPECT_EQ(st::launch_status(1025, 1, 0, 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(st::launch_status(1, 65535, 0, 0), cudaSuccess);
  EXPECT_EQ(st::launch_status(1, 65536, 0, 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(st::launch_status(32, 1, 48 * 1024, 0), cudaSuccess);
  EXPECT_EQ(st::launch_status(32, 1, 64 * 1024, 0), cudaErrorInvalidValue);  // not opted in
  EXPECT_EQ(st::launch_status(32, 1, 64 * 1024, 64 * 1024), cudaSuccess);
  EXPECT_EQ(st::launch_status(32, 1, 0, 228 * 1024), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // reading the error cleared it
}

TEST(Emulator, WmmaProductMatchesReference) {
  const std::vector<float> a = rounded<bf16>(randn(16 * 24 + 8, 1)),
                           b = rounded<bf16>(randn(16 * 16, 2)), c = randn(16 * 20, 3);
  Device<bf16> da(a), db(b);
  Device<float> dc(c), dd(std::vector<float>(16 * 20, NAN));
  st::wmma_product(dd.get(), da.get(), db.get(), dc.get(), 0);
  const std::vector<float> d = dd.read();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double want = c[i * 20 + j];
      for (int k = 0; k < 16; ++k) want += double(a[i * 24 + k]) * double(b[k + 16 * j]);
      EXPECT_NEAR(d[i * 20 + j], want, 1e-4) << i << "," << j;
    }
  EXPECT_NE(thrown([&] {
              st::wmma_product(dd.get(), da.get(), db.get(), dc.get(), 1);
            }).find("not 32-byte aligned"),
            std::string::npos);
}

TEST(Emulator, Bf16RoundsToNearestEven) {
  auto r = [](float x) { return __bfloat162float(__float2bfloat16_rn(x)); };
  EXPECT_EQ(r(1.0f + 1.0f / 256), 1.0f);               // tie: down to even
  EXPECT_EQ(r(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);  // tie: up to even
  EXPECT_EQ(r(1.0f + 1.0f / 256 + 1e-6f), 1.0f + 2.0f / 256);
  EXPECT_EQ(r(-3.0f), -3.0f);
  EXPECT_TRUE(std::isinf(r(INFINITY)));
  EXPECT_TRUE(std::isnan(r(NAN)));
  EXPECT_TRUE(std::isinf(r(3.4e38f)));  // rounds past the largest bf16
}

}  // namespace
}  // namespace pptrain::emulation_test
