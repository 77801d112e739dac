// Stream capture and graphs in the emulated runtime (emulator_graphs.cpp): captured work
// runs only when the graph is launched, and again at every launch; a copy from pinned
// memory reads it when it runs; what capture does not allow fails and invalidates it.
#include <gtest/gtest.h>

#include <vector>

#include "emulation_test_util.hpp"
#include "self_test_kernels.hpp"
#include "streams_test_util.hpp"

namespace pptrain::emulation_test {
namespace {

namespace st = emulator_selftest;

constexpr int kN = 300;
const char* const kSchedules[] = {"0", "1", "2", "sync"};

// The graph of what `steps` queues on s.
cudaGraphExec_t capture(cudaStream_t s, const std::function<void()>& steps) {
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  steps();
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  return exec;
}

TEST(EmulatedGraphs, CapturedWorkRunsAtEachLaunch) {
  for (const char* setting : kSchedules) {
    const ScopedSchedule schedule(setting);
    const OwnedStream s(cudaStreamNonBlocking);
    const DeviceFloats x(kN);
    st::fill(x.p, kN, 1.0f, s.s);
    cudaGraphExec_t exec = capture(s.s, [&] { st::scale_add(x.p, kN, 2.0f, 1.0f, s.s); });
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    EXPECT_EQ(x.download()[0], 1.0f) << setting;  // captured, not run
    for (int launch = 0; launch < 2; ++launch) EXPECT_EQ(cudaGraphLaunch(exec, s.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    EXPECT_EQ(x.download()[kN - 1], 7.0f) << setting;  // (1 * 2 + 1) * 2 + 1
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  }
}

TEST(EmulatedGraphs, APinnedSourceIsReadWhenTheCopyRuns) {
  const Asynchronous schedule;
  const OwnedStream s(cudaStreamNonBlocking);
  const DeviceFloats x(kN);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(float) * kN), cudaSuccess);
  std::vector<float> pageable(kN, 1.0f);
  std::fill(pinned, pinned + kN, 1.0f);
  // Outside a capture: a pageable source is taken at the call, a pinned one when it runs.
  ASSERT_EQ(cudaMemcpyAsync(x.p, pageable.data(), sizeof(float) * kN, cudaMemcpyHostToDevice, s.s),
            cudaSuccess);
  pageable.assign(kN, 2.0f);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(x.download()[0], 1.0f);
  ASSERT_EQ(cudaMemcpyAsync(x.p, pinned, sizeof(float) * kN, cudaMemcpyHostToDevice, s.s),
            cudaSuccess);
  std::fill(pinned, pinned + kN, 2.0f);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(x.download()[0], 2.0f);
  // In a graph each launch copies what the pinned buffer holds then.
  cudaGraphExec_t exec = capture(s.s, [&] {
    EXPECT_EQ(cudaMemcpyAsync(x.p, pinned, sizeof(float) * kN, cudaMemcpyHostToDevice, s.s),
              cudaSuccess);
    st::scale_add(x.p, kN, 2.0f, 1.0f, s.s);
  });
  for (const float value : {1.0f, 5.0f}) {
    std::fill(pinned, pinned + kN, value);
    ASSERT_EQ(cudaGraphLaunch(exec, s.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    EXPECT_EQ(x.download()[kN / 2], 2.0f * value + 1.0f);
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// Each call capture does not allow fails, and the capture ends invalidated.
TEST(EmulatedGraphs, WhatCaptureDoesNotAllowInvalidatesIt) {
  const Asynchronous schedule;
  const OwnedStream s(cudaStreamNonBlocking), other(cudaStreamNonBlocking);
  DeviceFloats x(kN);
  std::vector<float> pageable(kN, 1.0f);
  float* spare = nullptr;
  ASSERT_EQ(cudaMalloc(&spare, 64), cudaSuccess);
  cudaEvent_t outside = nullptr, inside = nullptr;
  ASSERT_EQ(cudaEventCreate(&outside), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&inside), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(outside, other.s), cudaSuccess);
  const std::vector<std::pair<const char*, std::function<cudaError_t()>>> refused = {
      {"stream synchronize", [&] { return cudaStreamSynchronize(s.s); }},
      {"device synchronize", [&] { return cudaDeviceSynchronize(); }},
      {"pageable copy",
       [&] {
         return cudaMemcpyAsync(x.p, pageable.data(), sizeof(float) * kN, cudaMemcpyHostToDevice,
                                s.s);
       }},
      {"blocking copy",
       [&] {
         return cudaMemcpy(pageable.data(), x.p, sizeof(float) * kN, cudaMemcpyDeviceToHost);
       }},
      {"cudaFree", [&] { return cudaFree(spare); }},
      {"a wait for work outside", [&] { return cudaStreamWaitEvent(s.s, outside, 0); }},
  };
  for (const auto& [what, call] : refused) {
    ASSERT_EQ(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal), cudaSuccess);
    st::fill(x.p, kN, 1.0f, s.s);
    EXPECT_NE(call(), cudaSuccess) << what;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(s.s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated) << what;
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s.s, &graph), cudaErrorStreamCaptureInvalidated) << what;
    EXPECT_EQ(graph, nullptr);
  }
  // An event recorded in a capture is a point of the graph: no query, no other stream's wait.
  ASSERT_EQ(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(inside, s.s), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s.s, inside, 0), cudaSuccess);  // its own: orders nothing more
  EXPECT_EQ(cudaEventQuery(inside), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaStreamWaitEvent(other.s, inside, 0), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.s, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFree(spare), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(outside), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(inside), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace pptrain::emulation_test
