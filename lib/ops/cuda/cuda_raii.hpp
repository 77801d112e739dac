// Move-only owners of CUDA resources: device memory, a stream, an event and a cuBLASLt
// handle. Construction creates the resource (throwing on failure); moves are noexcept
// and leave the source empty; destruction releases it, ignoring errors (a destructor
// must not throw, and a failed release at shutdown changes nothing we could act on).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "ops/cuda/cuda_check.hpp"

namespace pptrain::ops::cuda {

// Owns a handle H released by Release::operator()(H); an empty owner holds H{}.
template <typename H, typename Release>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(H h) noexcept : h_(h) {}
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, H{});
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() { reset(); }

  H get() const noexcept { return h_; }
  void reset() noexcept {
    if (h_ != H{}) Release{}(h_);
    h_ = H{};
  }

 private:
  H h_{};
};

struct FreeDeviceMemory {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
struct DestroyStream {
  void operator()(cudaStream_t s) const noexcept { (void)cudaStreamDestroy(s); }
};
struct DestroyEvent {
  void operator()(cudaEvent_t e) const noexcept { (void)cudaEventDestroy(e); }
};
struct DestroyGraphExec {
  void operator()(cudaGraphExec_t g) const noexcept { (void)cudaGraphExecDestroy(g); }
};
struct DestroyCublasLt {
  void operator()(cublasLtHandle_t h) const noexcept { (void)cublasLtDestroy(h); }
};

// `bytes` of device memory on the current device (cudaMalloc: 256-byte aligned).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(std::size_t bytes) {
    if (bytes == 0) return;
    void* p = nullptr;
    PPTRAIN_CUDA_CHECK(cudaMalloc(&p, bytes));
    mem_ = UniqueHandle<void*, FreeDeviceMemory>(p);
    bytes_ = bytes;
  }
  DeviceMemory(DeviceMemory&& o) noexcept
      : mem_(std::move(o.mem_)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    if (this != &o) {
      mem_ = std::move(o.mem_);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  void* get() const noexcept { return mem_.get(); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  UniqueHandle<void*, FreeDeviceMemory> mem_;
  std::size_t bytes_ = 0;
};

// An instantiated graph.
using GraphExec = UniqueHandle<cudaGraphExec_t, DestroyGraphExec>;

// A non-blocking stream (no implicit synchronisation with the legacy default stream).
class Stream {
 public:
  Stream() {
    cudaStream_t s = nullptr;
    PPTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    s_ = UniqueHandle<cudaStream_t, DestroyStream>(s);
  }
  cudaStream_t get() const noexcept { return s_.get(); }

 private:
  UniqueHandle<cudaStream_t, DestroyStream> s_;
};

// An event; without timing unless asked (cheaper to record and wait on).
class Event {
 public:
  explicit Event(bool timing = false) {
    cudaEvent_t e = nullptr;
    PPTRAIN_CUDA_CHECK(
        cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    e_ = UniqueHandle<cudaEvent_t, DestroyEvent>(e);
  }
  cudaEvent_t get() const noexcept { return e_.get(); }

 private:
  UniqueHandle<cudaEvent_t, DestroyEvent> e_;
};

class CublasLtHandle {
 public:
  CublasLtHandle() {
    cublasLtHandle_t h = nullptr;
    PPTRAIN_CUDA_CHECK(cublasLtCreate(&h));
    h_ = UniqueHandle<cublasLtHandle_t, DestroyCublasLt>(h);
  }
  cublasLtHandle_t get() const noexcept { return h_.get(); }

 private:
  UniqueHandle<cublasLtHandle_t, DestroyCublasLt> h_;
};

}  // namespace pptrain::ops::cuda
