// The emulated CUDA runtime's devices and memory (emulator_host_api.hpp): the registry of
// device allocations (256-byte aligned host memory, each on the device current when it was
// made), the device count (PPTRAIN_EMULATED_GPUS) and every device's properties.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "cuda_emulator.hpp"
#include "emulator_races.hpp"
#include "emulator_streams.hpp"

namespace pptrain_emu {

namespace {

// Process-wide, as a device's memory is; guarded for tests that run threads.
struct Allocation {
  std::size_t bytes;
  int device;
};
struct Registry {
  std::mutex mutex;
  std::map<const char*, Allocation> allocations;  // by base
  std::map<int, std::size_t> bytes;               // in use, by device
  std::uint64_t version = 0;                       // changes with every allocation and free
  std::map<const char*, std::size_t> pinned;       // cudaMallocHost's blocks: base -> bytes
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
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge:
      return "operation would have resulted in a merge of two independent captures";
    case cudaErrorStreamCaptureUnmatched:
      return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined:
      return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
  }
  return "unknown error";
}

// What an allocation of `bytes` takes: whole 256-byte granules.
static std::size_t rounded(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

cudaError_t device_malloc(void** p, std::size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* mem = std::aligned_alloc(256, rounded(bytes));
  if (mem == nullptr) return cudaErrorMemoryAllocation;
  std::memset(mem, 0xFF, rounded(bytes));  // NaN poison, as shared memory: never zeroed for free
  races::mark_device_memory(mem, rounded(bytes), true);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int device = current_device();
  r.allocations[static_cast<const char*>(mem)] = {bytes, device};
  r.bytes[device] += bytes;
  ++r.version;
  *p = mem;
  return cudaSuccess;
}

cudaError_t device_free(void* p) {
  if (p == nullptr) return cudaSuccess;
  Registry& r = registry();
  int device = 0;
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.allocations.find(static_cast<const char*>(p));
    if (it == r.allocations.end()) return cudaErrorInvalidValue;
    device = it->second.device;
  }
  if (const cudaError_t e = refuse_while_capturing(device, "cudaFree", cudaErrorStreamCaptureUnsupported);
      e != cudaSuccess)
    return e;
  synchronize_device(device);  // as cudaFree does: queued work may still use p
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.allocations.find(static_cast<const char*>(p));
    if (it == r.allocations.end()) return cudaErrorInvalidValue;  // freed meanwhile
    bytes = it->second.bytes;
    r.bytes[device] -= bytes;
    r.allocations.erase(it);
    ++r.version;
  }
  races::forget(p);
  races::mark_device_memory(p, rounded(bytes), false);
  std::free(p);
  return cudaSuccess;
}

void* host_alloc(std::size_t bytes) {
  void* p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{256});
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.pinned[static_cast<const char*>(p)] = bytes;
  return p;
}

void host_free(void* p) {
  if (p == nullptr) return;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.pinned.erase(static_cast<const char*>(p));
  }
  ::operator delete(p, std::align_val_t{256});
}

bool pinned(const void* p, std::size_t bytes) {
  const char* begin = static_cast<const char*>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.pinned.upper_bound(begin);
  if (it == r.pinned.begin()) return false;
  --it;
  return begin + bytes <= it->first + it->second;
}

bool device_range_ok(const void* p, std::size_t bytes) {
  const char* begin = static_cast<const char*>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.allocations.upper_bound(begin);
  if (it == r.allocations.begin()) return true;  // below every allocation: host memory
  --it;
  const char* base = it->first;
  if (begin >= base + it->second.bytes) return true;  // past this allocation: host memory
  return bytes <= std::size_t(base + it->second.bytes - begin);
}

void races::refresh_allocations(AllocationList& list) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (list.version == r.version) return;
  list.spans.clear();
  for (const auto& [base, a] : r.allocations) list.spans.emplace_back(base, a.bytes);
  list.version = r.version;
}

int device_of(const void* p, std::size_t bytes) {
  const char* begin = static_cast<const char*>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.allocations.upper_bound(begin);
  if (it == r.allocations.begin()) return -1;
  --it;
  const std::size_t offset = std::size_t(begin - it->first);
  return offset < it->second.bytes && bytes <= it->second.bytes - offset ? it->second.device : -1;
}

std::size_t device_bytes_in_use(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.bytes.find(device);
  return it == r.bytes.end() ? 0 : it->second;
}

int device_count() {
  const char* env = std::getenv("PPTRAIN_EMULATED_GPUS");
  if (env == nullptr) return 8;
  std::size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(env, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || env[used] != '\0' || n < 1 || n > 1024)
    throw std::invalid_argument(std::string("PPTRAIN_EMULATED_GPUS: \"") + env +
                                "\" is not a device count from 1 to 1024");
  return n;
}

bool valid_device(int device) { return device >= 0 && device < device_count(); }

int& current_device() {
  thread_local int device = 0;
  return device;
}

std::size_t device_memory_bytes() {  // an H200's, unless the environment says otherwise
  const char* gib = std::getenv("PPTRAIN_EMULATED_GPU_MEMORY_GIB");
  return std::size_t(gib ? std::strtod(gib, nullptr) * double(1 << 30) : double(141ull << 30));
}

cudaError_t device_properties(DeviceProp* prop, int device) {
  if (prop == nullptr) return cudaErrorInvalidValue;
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  *prop = DeviceProp{};
  std::strcpy(prop->name, "Emulated GPU");
  prop->totalGlobalMem = device_memory_bytes();
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
  if (!valid_device(device)) return cudaErrorInvalidDevice;
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

}  // namespace pptrain_emu
