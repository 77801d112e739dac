// Stream capture and graphs in the emulated runtime (emulator_graphs.cpp): captured work
// runs only when the graph is launched, and again at every launch; a copy from pinned
// memory reads it when it runs; what capture does not allow fails and invalidates it.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
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
  // An event recorded in a capture is a point of the graph: no query; after the capture
  // no stream can wait for it.
  ASSERT_EQ(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(inside, s.s), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s.s, inside, 0), cudaSuccess);  // its own: orders nothing more
  EXPECT_EQ(cudaEventQuery(inside), cudaErrorCapturedEvent);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.s, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(other.s, inside, 0), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaFree(spare), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(outside), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(inside), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Two streams in one capture: `other` joins by waiting for an event recorded in it and
// is joined back before the capture ends.
struct ForkJoin {
  cudaStream_t origin, other;
  cudaEvent_t fork = nullptr, join = nullptr;
  ForkJoin(cudaStream_t o, cudaStream_t b) : origin(o), other(b) {
    EXPECT_EQ(cudaEventCreate(&fork), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&join), cudaSuccess);
  }
  ~ForkJoin() {
    EXPECT_EQ(cudaEventDestroy(fork), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(join), cudaSuccess);
  }
  void branch() {  // other starts after what origin has reached
    ASSERT_EQ(cudaEventRecord(fork, origin), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(other, fork, 0), cudaSuccess);
  }
  void merge() {  // origin goes on after what other has reached
    ASSERT_EQ(cudaEventRecord(join, other), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(origin, join, 0), cudaSuccess);
  }
};

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  return status;
}

// Work forked onto another stream runs in every launch, ordered by the captured waits:
// x = 2 x + 1 on the origin, y = 3 x on the branch after it, then x = y back on the
// origin.
TEST(EmulatedGraphs, AForkedStreamRunsInEachLaunchInTheCapturedOrder) {
  for (const char* setting : kSchedules) {
    const ScopedSchedule schedule(setting);
    const OwnedStream s(cudaStreamNonBlocking), other(cudaStreamNonBlocking);
    const DeviceFloats x(kN), y(kN);
    st::fill(x.p, kN, 1.0f, s.s);
    ForkJoin fj(s.s, other.s);
    ASSERT_EQ(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal), cudaSuccess);
    st::scale_add(x.p, kN, 2.0f, 1.0f, s.s);
    fj.branch();
    EXPECT_EQ(capture_status(other.s), cudaStreamCaptureStatusActive) << setting;
    st::copy(y.p, x.p, kN, other.s);
    st::scale_add(y.p, kN, 3.0f, 0.0f, other.s);
    fj.merge();
    st::copy(x.p, y.p, kN, s.s);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s.s, &graph), cudaSuccess) << setting;
    EXPECT_EQ(capture_status(other.s), cudaStreamCaptureStatusNone) << setting;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    float expected = 1.0f;
    for (int launch = 0; launch < 2; ++launch) {
      ASSERT_EQ(cudaGraphLaunch(exec, s.s), cudaSuccess);
      expected = 3.0f * (2.0f * expected + 1.0f);
    }
    st::scale_add(x.p, kN, 1.0f, 1.0f, s.s);  // after the whole graph, the branch too
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    EXPECT_EQ(x.download()[kN - 1], expected + 1.0f) << setting;
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  }
}

// A branch the origin stream does not wait for before the capture ends fails it; so does
// ending the capture on the stream that joined it.
TEST(EmulatedGraphs, ABranchMustBeJoinedBeforeTheCaptureEnds) {
  const Asynchronous schedule;
  const OwnedStream s(cudaStreamNonBlocking), other(cudaStreamNonBlocking);
  const DeviceFloats x(kN), y(kN);
  ForkJoin fj(s.s, other.s);
  ASSERT_EQ(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  st::fill(x.p, kN, 1.0f, s.s);
  fj.branch();
  st::fill(y.p, kN, 2.0f, other.s);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(other.s, &graph), cudaErrorStreamCaptureUnmatched);
  EXPECT_EQ(cudaStreamEndCapture(s.s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(capture_status(other.s), cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  st::fill(x.p, kN, 1.0f, s.s);
  fj.branch();
  st::fill(y.p, kN, 2.0f, other.s);
  EXPECT_EQ(cudaStreamEndCapture(s.s, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(capture_status(other.s), cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A launch runs the branches of a graph as separate streams: a read on the origin that
// the captured waits do not order after the branch's write is a race, in every order.
TEST(EmulatedGraphs, BranchesOfALaunchAreOrderedOnlyByTheCapturedWaits) {
  for (const char* setting : {"0", "1", "2", "3"}) {
    const ScopedSchedule schedule(setting);
    const OwnedStream s(cudaStreamNonBlocking), other(cudaStreamNonBlocking);
    const DeviceFloats x(kN), total(1);
    ForkJoin fj(s.s, other.s);
    ASSERT_EQ(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal), cudaSuccess);
    fj.branch();
    st::fill(x.p, kN, 1.0f, other.s);
    st::sum(total.p, x.p, kN, s.s);  // before the merge: not ordered after the fill
    fj.merge();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s.s, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    std::string report;
    try {
      ASSERT_EQ(cudaGraphLaunch(exec, s.s), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    } catch (const std::logic_error& e) {
      report = e.what();
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_NE(report.find("emulated CUDA: stream race"), std::string::npos) << setting << ": " << report;
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  }
}

}  // namespace
}  // namespace pptrain::emulation_test
