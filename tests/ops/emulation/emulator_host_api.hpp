// The host side of the CUDA runtime as the emulator provides it (included by
// cuda_emulator.hpp; the bodies are in emulator_host.cpp): device memory is host memory
// from a registry of allocations, streams and events are tokens, and every call
// completes before it returns (launches run at once too), so synchronisation is a no-op
// that only checks its handle. One device, "Emulated GPU", shaped like an sm_90 part.
// Copies and memsets whose range starts inside a device allocation must end inside it
// (else cudaErrorInvalidValue); a range outside every allocation is taken as host
// memory, which the kernel tests hand to launchers directly.
#pragma once
#include <cstddef>
#include <cstring>

#include "emulator_runtime.hpp"

namespace pptrain_emu {

struct Event;
namespace host_names {  // enumerations and flags, exported unqualified below
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
inline constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
inline constexpr unsigned cudaEventDefault = 0, cudaEventBlockingSync = 1,
                          cudaEventDisableTiming = 2;
}  // namespace host_names
using namespace host_names;
struct DeviceProp {
  char name[256];
  std::size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin,
      sharedMemPerMultiprocessor;
  int regsPerBlock, warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
  int major, minor, multiProcessorCount, l2CacheSize;
};

const char* error_string(cudaError_t e);
// ---- device memory registry ----
cudaError_t device_malloc(void** p, std::size_t bytes);
cudaError_t device_free(void* p);
// True unless [p, p + bytes) starts inside a live allocation and leaves it.
bool device_range_ok(const void* p, std::size_t bytes);
std::size_t device_bytes_in_use();
// ---- devices, streams and events ----
int& current_device();
cudaError_t device_properties(DeviceProp* prop, int device);
cudaError_t device_attribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t stream_create(Stream** s);
cudaError_t stream_check(Stream* s);  // null (the legacy stream) is valid
cudaError_t stream_destroy(Stream* s);
cudaError_t event_create(Event** e);
cudaError_t event_check(Event* e);
cudaError_t event_destroy(Event* e);

}  // namespace pptrain_emu

using cudaDeviceProp = pptrain_emu::DeviceProp;
using cudaEvent_t = pptrain_emu::Event*;
using namespace pptrain_emu::host_names;  // NOLINT: the toolkit's names are global
using pptrain_emu::cudaErrorInvalidDevice;
using pptrain_emu::cudaErrorMemoryAllocation;
using pptrain_emu::cudaErrorNotReady;

static inline const char* cudaGetErrorString(cudaError_t e) { return pptrain_emu::error_string(e); }
static inline const char* cudaGetErrorName(cudaError_t e) { return pptrain_emu::error_string(e); }

// ---- devices ----
static inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int device) {
  if (device != 0) return pptrain_emu::cudaErrorInvalidDevice;
  pptrain_emu::current_device() = device;
  return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int* device) {
  *device = pptrain_emu::current_device();
  return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return pptrain_emu::device_properties(prop, device);
}
static inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  return pptrain_emu::device_attribute(value, attr, device);
}
static inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

// ---- memory ----
static inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  return pptrain_emu::device_malloc(p, bytes);
}
template <typename T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return pptrain_emu::device_malloc(reinterpret_cast<void**>(p), bytes);
}
static inline cudaError_t cudaFree(void* p) { return pptrain_emu::device_free(p); }
static inline cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  *total = std::size_t(141) << 30;
  *free = *total - pptrain_emu::device_bytes_in_use();
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes,
                                     cudaMemcpyKind) {
  if (!pptrain_emu::device_range_ok(dst, bytes) || !pptrain_emu::device_range_ok(src, bytes))
    return cudaErrorInvalidValue;
  if (bytes != 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes,
                                          cudaMemcpyKind kind, cudaStream_t s) {
  if (const cudaError_t e = pptrain_emu::stream_check(s); e != cudaSuccess) return e;
  return cudaMemcpy(dst, src, bytes, kind);
}
static inline cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  if (!pptrain_emu::device_range_ok(p, bytes)) return cudaErrorInvalidValue;
  if (bytes != 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes,
                                          cudaStream_t s = nullptr) {
  if (const cudaError_t e = pptrain_emu::stream_check(s); e != cudaSuccess) return e;
  return cudaMemset(p, value, bytes);
}

// ---- streams and events: all work is done by the time a call returns ----
static inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return pptrain_emu::stream_create(s);
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  return pptrain_emu::stream_create(s);
}
static inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int) {
  return pptrain_emu::stream_create(s);
}
static inline cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  return pptrain_emu::stream_destroy(s);
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return pptrain_emu::stream_check(s);
}
static inline cudaError_t cudaStreamQuery(cudaStream_t s) { return pptrain_emu::stream_check(s); }
static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return pptrain_emu::event_create(e); }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  return pptrain_emu::event_create(e);
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { return pptrain_emu::event_destroy(e); }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
  if (const cudaError_t err = pptrain_emu::stream_check(s); err != cudaSuccess) return err;
  return pptrain_emu::event_check(e);
}
static inline cudaError_t cudaEventQuery(cudaEvent_t e) { return pptrain_emu::event_check(e); }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return pptrain_emu::event_check(e);
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
  if (const cudaError_t err = pptrain_emu::stream_check(s); err != cudaSuccess) return err;
  return pptrain_emu::event_check(e);
}
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = 0.0f;  // no timing in the emulator
  if (const cudaError_t err = pptrain_emu::event_check(a); err != cudaSuccess) return err;
  return pptrain_emu::event_check(b);
}
