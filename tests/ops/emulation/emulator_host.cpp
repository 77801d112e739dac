// The emulated CUDA runtime's host side (emulator_host_api.hpp): the registry of device
// allocations (256-byte aligned host memory), the one device's properties, and stream
// and event tokens that are checked on every use.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>

#include "cuda_emulator.hpp"

namespace pptrain_emu {

struct Stream {};
struct Event {};

namespace {

// Process-wide, as a device's memory is; guarded for tests that run threads.
struct Registry {
  std::mutex mutex;
  std::map<const char*, std::size_t> allocations;  // base -> bytes
  std::set<const Stream*> streams;
  std::set<const Event*> events;
  std::size_t bytes = 0;
};
Registry& registry() {
  static Registry r;
  return r;
}

constexpr std::size_t kOptinSharedBytes = 227 * 1024;

}  // namespace

const char* error_string(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
  }
  return "unknown error";
}

cudaError_t device_malloc(void** p, std::size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  void* mem = std::aligned_alloc(256, rounded);
  if (mem == nullptr) return cudaErrorMemoryAllocation;
  std::memset(mem, 0xFF, rounded);  // NaN poison, as shared memory: never zeroed for free
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.allocations[static_cast<const char*>(mem)] = bytes;
  r.bytes += bytes;
  *p = mem;
  return cudaSuccess;
}

cudaError_t device_free(void* p) {
  if (p == nullptr) return cudaSuccess;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.allocations.find(static_cast<const char*>(p));
    if (it == r.allocations.end()) return cudaErrorInvalidValue;
    r.bytes -= it->second;
    r.allocations.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

bool device_range_ok(const void* p, std::size_t bytes) {
  const char* begin = static_cast<const char*>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.allocations.upper_bound(begin);
  if (it == r.allocations.begin()) return true;  // below every allocation: host memory
  --it;
  const char* base = it->first;
  if (begin >= base + it->second) return true;  // past this allocation: host memory
  return bytes <= std::size_t(base + it->second - begin);
}

std::size_t device_bytes_in_use() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.bytes;
}

int& current_device() {
  thread_local int device = 0;
  return device;
}

cudaError_t device_properties(DeviceProp* prop, int device) {
  if (prop == nullptr) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = DeviceProp{};
  std::strcpy(prop->name, "Emulated GPU");
  prop->totalGlobalMem = std::size_t(141) << 30;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = kOptinSharedBytes;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7FFFFFFF, prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9, prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 50 << 20;
  return cudaSuccess;
}

cudaError_t device_attribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 * 1024;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = int(kOptinSharedBytes);
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

cudaError_t stream_create(Stream** s) {
  if (s == nullptr) return cudaErrorInvalidValue;
  *s = new Stream;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.streams.insert(*s);
  return cudaSuccess;
}
cudaError_t stream_check(Stream* s) {
  if (s == nullptr) return cudaSuccess;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.streams.count(s) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
cudaError_t stream_destroy(Stream* s) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (s == nullptr || r.streams.erase(s) == 0) return cudaErrorInvalidResourceHandle;
  }
  delete s;
  return cudaSuccess;
}

cudaError_t event_create(Event** e) {
  if (e == nullptr) return cudaErrorInvalidValue;
  *e = new Event;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.events.insert(*e);
  return cudaSuccess;
}
cudaError_t event_check(Event* e) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return e != nullptr && r.events.count(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
cudaError_t event_destroy(Event* e) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (e == nullptr || r.events.erase(e) == 0) return cudaErrorInvalidResourceHandle;
  }
  delete e;
  return cudaSuccess;
}

}  // namespace pptrain_emu
