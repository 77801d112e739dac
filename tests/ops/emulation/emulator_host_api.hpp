// The host side of the CUDA runtime as the emulator provides it (included by
// cuda_emulator.hpp; the bodies are in emulator_host.cpp, emulator_stream_api.cpp and
// emulator_copies.cpp): device memory is host memory from a registry of allocations.
// Launches, asynchronous copies and memsets, event records and waits are queued on their
// stream (emulator_streams.cpp) and run only when a host call makes them due: a stream,
// event or device synchronisation, a query (which runs what can run, then reports), a
// blocking copy or memset (on the legacy stream: ordered after the blocking streams'
// work), or cudaFree (which synchronises the allocation's device first). Streams created
// without cudaStreamNonBlocking are ordered with the legacy stream, as CUDA documents.
// PPTRAIN_EMULATED_GPUS devices (default 8), "Emulated GPU", each shaped like an sm_90
// part; an allocation, stream or event belongs to the device current when it was made.
// Copies and memsets whose range starts inside a device allocation must end inside it
// (else cudaErrorInvalidValue); a range outside every allocation is taken as host
// memory, which the kernel tests hand to launchers directly.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

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
// ---- device memory registry (emulator_host.cpp) ----
cudaError_t device_malloc(void** p, std::size_t bytes);
cudaError_t device_free(void* p);  // synchronises the allocation's device first
// True unless [p, p + bytes) starts inside a live allocation and leaves it.
bool device_range_ok(const void* p, std::size_t bytes);
std::size_t device_bytes_in_use(int device);
std::size_t device_memory_bytes();  // each device's: 141 GiB, or PPTRAIN_EMULATED_GPU_MEMORY_GIB
// ---- devices (emulator_host.cpp) ----
int device_count();  // PPTRAIN_EMULATED_GPUS, default 8; throws on a malformed value
bool valid_device(int device);
int& current_device();
cudaError_t device_properties(DeviceProp* prop, int device);
cudaError_t device_attribute(int* value, cudaDeviceAttr attr, int device);
// ---- streams, events and synchronisation (emulator_stream_api.cpp) ----
cudaError_t stream_create(Stream** s, unsigned flags);
cudaError_t stream_check(Stream* s);         // null (the legacy stream) is valid
cudaError_t launch_stream_check(Stream* s);  // and the stream is on the current device
cudaError_t stream_destroy(Stream* s);
cudaError_t stream_synchronize(Stream* s);
cudaError_t stream_query(Stream* s);
cudaError_t stream_wait_event(Stream* s, Event* e);
cudaError_t event_create(Event** e);
cudaError_t event_check(Event* e);
cudaError_t event_destroy(Event* e);
cudaError_t event_record(Event* e, Stream* s);
cudaError_t event_query(Event* e);
cudaError_t event_synchronize(Event* e);
cudaError_t device_synchronize();  // the current device
void synchronize_device(int device);
// ---- pinned host memory (emulator_host.cpp): copies from it read it when they run ----
void* host_alloc(std::size_t bytes);
void host_free(void* p);
bool pinned(const void* p, std::size_t bytes);  // all of [p, p + bytes) in one pinned block
// ---- stream capture and graphs (emulator_graphs.cpp) ----
struct Graph;
struct GraphExec;
namespace host_names {
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
}  // namespace host_names
cudaError_t stream_begin_capture(Stream* s, cudaStreamCaptureMode mode);
cudaError_t stream_end_capture(Stream* s, Graph** graph);
cudaError_t stream_is_capturing(Stream* s, cudaStreamCaptureStatus* status);
cudaError_t graph_instantiate(GraphExec** exec, Graph* graph);
cudaError_t graph_launch(GraphExec* exec, Stream* s);
cudaError_t graph_destroy(Graph* graph);
cudaError_t graph_exec_destroy(GraphExec* exec);
// `code` (and the device's captures end invalidated) when a stream of `device` captures:
// calls that synchronise or use the legacy stream are not allowed then; else cudaSuccess.
cudaError_t refuse_while_capturing(int device, const char* what, cudaError_t code);
// ---- copies and memsets (emulator_copies.cpp) ----
cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                         Stream* s);
cudaError_t memcpy_blocking(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t memset_async(void* p, int value, std::size_t bytes, Stream* s);
cudaError_t memset_blocking(void* p, int value, std::size_t bytes);

}  // namespace pptrain_emu

using cudaDeviceProp = pptrain_emu::DeviceProp;
using cudaEvent_t = pptrain_emu::Event*;
using namespace pptrain_emu::host_names;  // NOLINT: the toolkit's names are global
using pptrain_emu::cudaErrorInvalidDevice;
using pptrain_emu::cudaErrorInvalidResourceHandle;
using pptrain_emu::cudaErrorMemoryAllocation;
using pptrain_emu::cudaErrorNotReady;

static inline const char* cudaGetErrorString(cudaError_t e) { return pptrain_emu::error_string(e); }
static inline const char* cudaGetErrorName(cudaError_t e) { return pptrain_emu::error_string(e); }

// ---- devices ----
static inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = pptrain_emu::device_count();
  return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int device) {
  if (!pptrain_emu::valid_device(device)) return pptrain_emu::cudaErrorInvalidDevice;
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
static inline cudaError_t cudaDeviceSynchronize() { return pptrain_emu::device_synchronize(); }

// ---- memory ----
static inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  return pptrain_emu::device_malloc(p, bytes);
}
template <typename T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return pptrain_emu::device_malloc(reinterpret_cast<void**>(p), bytes);
}
static inline cudaError_t cudaFree(void* p) { return pptrain_emu::device_free(p); }
// Pinned host memory: a copy from it reads it when the copy runs (from pageable memory,
// at the call), as on a GPU.
static inline cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  *p = pptrain_emu::host_alloc(bytes);
  return cudaSuccess;
}
static inline cudaError_t cudaFreeHost(void* p) {
  pptrain_emu::host_free(p);
  return cudaSuccess;
}
static inline cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  *total = pptrain_emu::device_memory_bytes();
  const std::size_t used = pptrain_emu::device_bytes_in_use(pptrain_emu::current_device());
  *free = *total > used ? *total - used : 0;
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes,
                                     cudaMemcpyKind kind) {
  return pptrain_emu::memcpy_blocking(dst, src, bytes, kind);
}
static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes,
                                          cudaMemcpyKind kind, cudaStream_t s = nullptr) {
  return pptrain_emu::memcpy_async(dst, src, bytes, kind, s);
}
static inline cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  return pptrain_emu::memset_blocking(p, value, bytes);
}
static inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes,
                                          cudaStream_t s = nullptr) {
  return pptrain_emu::memset_async(p, value, bytes, s);
}

// ---- streams and events: work runs when one of these calls makes it due ----
static inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return pptrain_emu::stream_create(s, cudaStreamDefault);
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  return pptrain_emu::stream_create(s, flags);
}
static inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) {
  return pptrain_emu::stream_create(s, flags);
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
  return pptrain_emu::stream_synchronize(s);
}
static inline cudaError_t cudaStreamQuery(cudaStream_t s) { return pptrain_emu::stream_query(s); }
static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return pptrain_emu::event_create(e); }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  return pptrain_emu::event_create(e);
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { return pptrain_emu::event_destroy(e); }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
  return pptrain_emu::event_record(e, s);
}
static inline cudaError_t cudaEventQuery(cudaEvent_t e) { return pptrain_emu::event_query(e); }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return pptrain_emu::event_synchronize(e);
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
  return pptrain_emu::stream_wait_event(s, e);
}
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = 0.0f;  // no timing in the emulator
  if (const cudaError_t err = pptrain_emu::event_check(a); err != cudaSuccess) return err;
  return pptrain_emu::event_check(b);
}

// ---- stream capture and graphs: one stream's work recorded in order, replayed whole ----
using cudaGraph_t = pptrain_emu::Graph*;
using cudaGraphExec_t = pptrain_emu::GraphExec*;
using pptrain_emu::cudaErrorCapturedEvent;
using pptrain_emu::cudaErrorStreamCaptureImplicit;
using pptrain_emu::cudaErrorStreamCaptureInvalidated;
using pptrain_emu::cudaErrorStreamCaptureIsolation;
using pptrain_emu::cudaErrorStreamCaptureMerge;
using pptrain_emu::cudaErrorStreamCaptureUnjoined;
using pptrain_emu::cudaErrorStreamCaptureUnmatched;
using pptrain_emu::cudaErrorStreamCaptureUnsupported;
static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  return pptrain_emu::stream_begin_capture(s, mode);
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  return pptrain_emu::stream_end_capture(s, graph);
}
static inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  return pptrain_emu::stream_is_capturing(s, status);
}
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                               unsigned long long flags = 0) {
  if (flags != 0) return cudaErrorInvalidValue;
  return pptrain_emu::graph_instantiate(exec, graph);
}
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  return pptrain_emu::graph_launch(exec, s);
}
static inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return pptrain_emu::graph_destroy(graph);
}
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  return pptrain_emu::graph_exec_destroy(exec);
}
