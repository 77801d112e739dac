// The emulated runtime's calls around the asynchronous streams (emulator_host_api.hpp):
// nothing runs before it is due, host-to-device copies stage their source, the legacy
// stream's implicit ordering, cudaFree and stream destruction, several devices
// (PPTRAIN_EMULATED_GPUS, device_of, a device's synchronisation), and host threads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emulation_test_util.hpp"
#include "emulator_streams.hpp"
#include "self_test_kernels.hpp"
#include "streams_test_util.hpp"

namespace pptrain::emulation_test {
namespace {

namespace st = emulator_selftest;

constexpr int kN = 200;
constexpr unsigned kSeeds = 16;

TEST(EmulatedRuntime, NothingRunsBeforeItIsDue) {
  const Asynchronous schedule;
  const OwnedStream s(cudaStreamNonBlocking);
  const DeviceFloats x(kN);
  std::vector<float> host(kN, 0.0f);
  st::fill(x.p, kN, 2.0f, s.s);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), x.p, sizeof(float) * kN, cudaMemcpyDeviceToHost, s.s),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x.p, 0, sizeof(float) * kN, s.s), cudaSuccess);
  EXPECT_EQ(host[0], 0.0f);  // queued, not run
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(host[0], 2.0f);
  EXPECT_EQ(x.download()[kN - 1], 0.0f);
}

TEST(EmulatedRuntime, HostToDeviceCopyStagesItsSource) {
  const Asynchronous schedule;
  const OwnedStream s(cudaStreamNonBlocking);
  const DeviceFloats x(kN);
  std::vector<float> host(kN, 1.0f);
  ASSERT_EQ(cudaMemcpyAsync(x.p, host.data(), sizeof(float) * kN, cudaMemcpyHostToDevice, s.s),
            cudaSuccess);
  host.assign(kN, 2.0f);  // pageable memory: free to reuse once the call returns
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(x.download(), std::vector<float>(kN, 1.0f));
}

TEST(EmulatedRuntime, LegacyStreamIsOrderedWithBlockingStreamsOnly) {
  for (unsigned seed = 0; seed < kSeeds; ++seed) {
    const ScopedSchedule schedule(std::to_string(seed));
    const OwnedStream blocking(cudaStreamDefault), non_blocking(cudaStreamNonBlocking);
    const DeviceFloats x(kN), y(kN), z(kN);
    // The legacy stream waits for a blocking stream's earlier work...
    st::fill(x.p, kN, 3.0f, blocking.s);
    st::copy(y.p, x.p, kN, nullptr);
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    EXPECT_EQ(y.download()[0], 3.0f) << "seed " << seed;
    // ...a blocking stream waits for the legacy stream's...
    st::fill(x.p, kN, 5.0f, nullptr);
    st::copy(y.p, x.p, kN, blocking.s);
    EXPECT_EQ(cudaStreamSynchronize(blocking.s), cudaSuccess);
    EXPECT_EQ(y.download()[0], 5.0f) << "seed " << seed;
    // ...a blocking copy waits for a blocking stream's work...
    st::fill(x.p, kN, 6.0f, blocking.s);
    EXPECT_EQ(x.download()[0], 6.0f) << "seed " << seed;
    // ...and nothing orders a non-blocking stream with the legacy one.
    st::fill(z.p, kN, 7.0f, non_blocking.s);
    st::copy(y.p, z.p, kN, nullptr);
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    EXPECT_TRUE(std::isnan(y.download()[0])) << "seed " << seed;
    // which the race detector reports once the fill runs after the copy that read z.
    EXPECT_THROW(cudaDeviceSynchronize(), std::logic_error) << "seed " << seed;
  }
}

TEST(EmulatedRuntime, FreeAndDestroyLetQueuedWorkFinish) {
  const Asynchronous schedule;
  std::vector<float> host(kN, 0.0f);
  {
    const OwnedStream s(cudaStreamNonBlocking);
    const DeviceFloats x(kN);
    st::fill(x.p, kN, 8.0f, s.s);
    ASSERT_EQ(cudaMemcpyAsync(host.data(), x.p, sizeof(float) * kN, cudaMemcpyDeviceToHost, s.s),
              cudaSuccess);
    void* other = nullptr;
    ASSERT_EQ(cudaMalloc(&other, 64), cudaSuccess);
    EXPECT_EQ(host[0], 0.0f);
    EXPECT_EQ(cudaFree(other), cudaSuccess);  // synchronises the device first
    EXPECT_EQ(host[0], 8.0f);
  }
  // A destroyed stream's queued work still runs, and freeing the memory it uses waits.
  host.assign(kN, 0.0f);
  const DeviceFloats x(kN);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  st::fill(x.p, kN, 9.0f, s);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), x.p, sizeof(float) * kN, cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(host[0], 0.0f);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(host[kN - 1], 9.0f);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
}

TEST(EmulatedRuntime, AllocationsStreamsAndEventsBelongToADevice) {
  const Asynchronous schedule;
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  char* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  cudaStream_t s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(pptrain_emu::device_of(p, 1024), 2);
  EXPECT_EQ(pptrain_emu::device_of(p + 512, 512), 2);
  EXPECT_EQ(pptrain_emu::device_of(p + 512, 513), -1);  // leaves the allocation
  EXPECT_EQ(pptrain_emu::device_of(p + 1024, 0), -1);
  std::vector<char> host(1024, 1);
  EXPECT_EQ(pptrain_emu::device_of(host.data(), 1), -1);
  const DeviceFloats on0(4);
  EXPECT_EQ(pptrain_emu::device_of(on0.p, 16), 0);

  // A launch on another device's stream fails at once; an event records on its own
  // device's streams only; a copy may use any device's stream.
  st::fill(on0.p, 4, 1.0f, s2);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  cudaEvent_t e0 = nullptr;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e0, s2), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamWaitEvent(s2, e0, 0), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), p, 1024, cudaMemcpyDeviceToHost, s2), cudaSuccess);
  // Synchronising device 0 leaves device 2's work queued.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(host[0], 1);
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_NE(host[0], 1);  // cudaMalloc's poison
  EXPECT_EQ(cudaStreamDestroy(s2), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(pptrain_emu::device_of(p, 1), -1);
}

TEST(EmulatedRuntime, HostThreadsShareTheQueues) {
  // Each thread drives its own stream (and may run the others' work when it waits).
  const Asynchronous schedule;
  std::vector<float> results(4, 0.0f);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &results] {
      const OwnedStream s(cudaStreamNonBlocking);
      const DeviceFloats x(kN), total(1);
      for (int round = 0; round < 20; ++round) {
        st::fill(x.p, kN, float(t), s.s);
        st::scale_add(x.p, kN, 2.0f, 1.0f, s.s);
        st::sum(total.p, x.p, kN, s.s);
        EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
      }
      results[t] = total.download()[0];
    });
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(results[t], float(kN * (2 * t + 1))) << t;
}

// PPTRAIN_EMULATED_GPUS set to `value` (unset when null) while in scope.
class ScopedGpus {
 public:
  explicit ScopedGpus(const char* value) {
    if (const char* old = std::getenv(kName)) saved_ = old, had_ = true;
    set(value);
  }
  ~ScopedGpus() { set(had_ ? saved_.c_str() : nullptr); }
  ScopedGpus(const ScopedGpus&) = delete;
  ScopedGpus& operator=(const ScopedGpus&) = delete;

 private:
  static constexpr const char* kName = "PPTRAIN_EMULATED_GPUS";
  static void set(const char* value) {
    if (value)
      setenv(kName, value, 1);
    else
      unsetenv(kName);
  }
  std::string saved_;
  bool had_ = false;
};

TEST(EmulatedRuntime, DeviceCountComesFromTheEnvironment) {
  int n = 0;
  {
    const ScopedGpus gpus(nullptr);
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    EXPECT_EQ(n, 8);
    EXPECT_EQ(cudaSetDevice(7), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(8), cudaErrorInvalidDevice);
  }
  {
    const ScopedGpus gpus("3");
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(cudaSetDevice(3), cudaErrorInvalidDevice);
    cudaDeviceProp prop{};
    EXPECT_EQ(cudaGetDeviceProperties(&prop, 2), cudaSuccess);
    EXPECT_STREQ(prop.name, "Emulated GPU");
    EXPECT_EQ(cudaGetDeviceProperties(&prop, 3), cudaErrorInvalidDevice);
  }
  {
    const ScopedGpus gpus("two");
    EXPECT_THROW(cudaGetDeviceCount(&n), std::invalid_argument);
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

}  // namespace
}  // namespace pptrain::emulation_test
