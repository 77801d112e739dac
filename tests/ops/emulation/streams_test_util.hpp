// Helpers for the emulated-stream tests: a schedule setting in scope, a stream and a
// device array that clean up after themselves, and downloads.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "emulator_races.hpp"
#include "emulator_streams.hpp"

namespace pptrain::emulation_test {

// The streams' schedule (a seed or "sync") while in scope.
class ScopedSchedule {
 public:
  explicit ScopedSchedule(const std::string& setting) : saved_(pptrain_emu::stream_schedule()) {
    pptrain_emu::set_stream_schedule(setting);
  }
  ~ScopedSchedule() { pptrain_emu::set_stream_schedule(saved_); }
  ScopedSchedule(const ScopedSchedule&) = delete;
  ScopedSchedule& operator=(const ScopedSchedule&) = delete;

 private:
  std::string saved_;
};

// The current seed, or seed 0 under the "sync" schedule: for the tests of queued work.
class Asynchronous : public ScopedSchedule {
 public:
  Asynchronous() : ScopedSchedule(pptrain_emu::stream_schedule() == "sync" ? "0"
                                                                           : pptrain_emu::stream_schedule()) {}
};

// The race detector on or off while in scope.
class ScopedRaceDetector {
 public:
  explicit ScopedRaceDetector(bool on) : saved_(pptrain_emu::races::enabled()) {
    pptrain_emu::races::set_enabled(on);
  }
  ~ScopedRaceDetector() { pptrain_emu::races::set_enabled(saved_); }
  ScopedRaceDetector(const ScopedRaceDetector&) = delete;
  ScopedRaceDetector& operator=(const ScopedRaceDetector&) = delete;

 private:
  bool saved_;
};

struct OwnedStream {
  cudaStream_t s = nullptr;
  explicit OwnedStream(unsigned flags) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  }
  ~OwnedStream() { EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
};

// n floats of device memory on the current device (NaN-poisoned by cudaMalloc).
struct DeviceFloats {
  float* p = nullptr;
  int n;
  explicit DeviceFloats(int count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, sizeof(float) * n), cudaSuccess);
  }
  ~DeviceFloats() { EXPECT_EQ(cudaFree(p), cudaSuccess); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  // A blocking copy: on the legacy stream, so after the blocking streams' work only.
  std::vector<float> download() const {
    std::vector<float> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, sizeof(float) * n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

}  // namespace pptrain::emulation_test
