// The race detector (emulator_races.hpp): two streams' items that touch the same bytes,
// one of them writing, with no event wait or synchronisation between them, fail the run
// with a message naming both items and the allocation, in every order the scheduler can
// choose; ordered items, readers only and disjoint bytes pass.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "emulation_test_util.hpp"
#include "self_test_kernels.hpp"
#include "streams_test_util.hpp"

namespace pptrain::emulation_test {
namespace {

namespace st = emulator_selftest;

constexpr int kN = 300;
const char* const kSchedules[] = {"0", "1", "2", "3", "4", "5", "6", "7", "sync"};

// Runs `steps` and then synchronises the device; the race report, or "" when none.
template <class Steps>
std::string race_in(Steps steps) {
  try {
    steps();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } catch (const std::logic_error& e) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the rest runs: reported once
    return e.what();
  }
  return "";
}

TEST(EmulatedRaces, AMissingEventWaitIsReportedInEveryOrder) {
  for (const char* setting : kSchedules) {
    const ScopedSchedule schedule(setting);
    const OwnedStream compute(cudaStreamNonBlocking), side(cudaStreamNonBlocking);
    const DeviceFloats grad(kN), total(1);
    const std::string report = race_in([&] {
      st::fill(grad.p, kN, 1.0f, compute.s);
      st::scale_add(grad.p, kN, 2.0f, 1.0f, compute.s);
      st::sum(total.p, grad.p, kN, side.s);  // no wait for the backward
    });
    EXPECT_NE(report.find("emulated CUDA: stream race: stream "), std::string::npos)
        << setting << ": " << report;
    EXPECT_NE(report.find(std::to_string(kN * sizeof(float)) + "-byte device allocation"),
              std::string::npos)
        << report;
    EXPECT_NE(report.find("and no event wait or synchronisation orders the two"),
              std::string::npos)
        << report;
  }
}

TEST(EmulatedRaces, EventWaitsAndHostSynchronisationOrderItems) {
  for (const char* setting : kSchedules) {
    const ScopedSchedule schedule(setting);
    const OwnedStream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
    const DeviceFloats x(kN), total(1);
    cudaEvent_t ready = nullptr;
    ASSERT_EQ(cudaEventCreate(&ready), cudaSuccess);
    EXPECT_EQ(race_in([&] {
      st::fill(x.p, kN, 1.0f, a.s);
      EXPECT_EQ(cudaEventRecord(ready, a.s), cudaSuccess);
      EXPECT_EQ(cudaStreamWaitEvent(b.s, ready, 0), cudaSuccess);
      st::scale_add(x.p, kN, 2.0f, 1.0f, b.s);  // after the event
      EXPECT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
      st::sum(total.p, x.p, kN, a.s);  // after the host saw b finish
      EXPECT_EQ(cudaEventRecord(ready, a.s), cudaSuccess);
      while (cudaEventQuery(ready) == cudaErrorNotReady) {
      }
      st::fill(x.p, kN, 3.0f, b.s);  // after the host's query saw a finish
    }), "") << setting;
    EXPECT_EQ(cudaEventDestroy(ready), cudaSuccess);
    EXPECT_EQ(x.download()[0], 3.0f);
  }
}

TEST(EmulatedRaces, ReadersAndDisjointBytesDoNotRace) {
  for (const char* setting : kSchedules) {
    const ScopedSchedule schedule(setting);
    const OwnedStream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
    const DeviceFloats x(kN), totals(2);
    st::fill(x.p, kN, 1.0f, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(race_in([&] {
      st::sum(totals.p, x.p, kN, a.s);  // both read x
      st::sum(totals.p + 1, x.p, kN, b.s);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // then, after both reads,
      st::scale_add(x.p, kN / 2, 2.0f, 0.0f, a.s);  // each writes its own half
      st::scale_add(x.p + kN / 2, kN / 2, 2.0f, 0.0f, b.s);
    }), "") << setting;
  }
}

TEST(EmulatedRaces, OneSharedFloatIsARace) {
  const Asynchronous schedule;
  const OwnedStream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  const DeviceFloats x(kN);
  const std::string report = race_in([&] {
    st::fill(x.p, kN / 2 + 1, 1.0f, a.s);
    st::fill(x.p + kN / 2, kN / 2, 2.0f, b.s);
  });
  const std::size_t byte = kN / 2 * sizeof(float);
  EXPECT_NE(report.find("bytes [" + std::to_string(byte) + ", " + std::to_string(byte + 4) + ")"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("wrote"), std::string::npos) << report;
}

// x = a x + b loads and stores x in one statement: both accesses are seen.
TEST(EmulatedRaces, AReadModifyWriteWritesToo) {
  const Asynchronous schedule;
  const OwnedStream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  const DeviceFloats x(kN);
  st::fill(x.p, kN, 1.0f, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::string report = race_in([&] {
    st::scale_add(x.p, kN, 2.0f, 1.0f, a.s);
    st::scale_add(x.p, kN, 3.0f, 0.0f, b.s);
  });
  EXPECT_NE(report.find("emulated CUDA: stream race: stream "), std::string::npos) << report;
  EXPECT_NE(report.find("wrote"), std::string::npos) << report;
}

TEST(EmulatedRaces, CopiesAndMemsetsAreAccessesToo) {
  const Asynchronous schedule;
  const OwnedStream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  const DeviceFloats x(kN), y(kN);
  std::string report = race_in([&] {
    st::fill(x.p, kN, 1.0f, a.s);
    EXPECT_EQ(cudaMemcpyAsync(y.p, x.p, sizeof(float) * kN, cudaMemcpyDeviceToDevice, b.s),
              cudaSuccess);
  });
  EXPECT_NE(report.find("cudaMemcpyAsync of 1200 bytes, device to device"), std::string::npos)
      << report;
  report = race_in([&] {
    st::fill(x.p, kN, 1.0f, a.s);
    EXPECT_EQ(cudaMemsetAsync(x.p, 0, sizeof(float), b.s), cudaSuccess);
  });
  EXPECT_NE(report.find("cudaMemsetAsync of 4 bytes"), std::string::npos) << report;
}

TEST(EmulatedRaces, OffItLetsTheSeededOrdersDecide) {
  const ScopedRaceDetector off(false);
  const ScopedSchedule schedule("sync");
  const OwnedStream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  const DeviceFloats x(kN);
  EXPECT_EQ(race_in([&] {
    st::fill(x.p, kN, 1.0f, a.s);
    st::fill(x.p, kN, 2.0f, b.s);
  }), "");
}

}  // namespace
}  // namespace pptrain::emulation_test
