// The emulated runtime's copies and memsets (emulator_host_api.hpp) as stream work. The
// ranges are checked when the call is made; the bytes move when the work is due, except
// that an asynchronous copy from pageable host memory stages its source at the call, as
// CUDA does (from pinned memory, cudaMallocHost's, it reads the source when it runs; a
// capturing stream takes only those). The blocking forms queue on the legacy stream and
// wait for their item; a capture on the device refuses them. A device range freed
// before its work ran is reported as a fault.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_emulator.hpp"
#include "emulator_schedule.hpp"

namespace pptrain_emu {
namespace {

const char* direction(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost: return "host to host";
    case cudaMemcpyHostToDevice: return "host to device";
    case cudaMemcpyDeviceToHost: return "device to host";
    case cudaMemcpyDeviceToDevice: return "device to device";
    case cudaMemcpyDefault: return "default";
  }
  return "?";
}

// A device range (device >= 0 when the call was made) must still be that allocation.
void still_allocated(const void* p, std::size_t bytes, int device, const std::string& what) {
  if (device >= 0 && device_of(p, bytes) != device)
    throw std::runtime_error("emulated CUDA: " + what +
                             ": its device memory was freed before the queued work ran");
}

cudaError_t queue_and_maybe_wait(Stream* s, std::string what, Work work, bool block,
                                 bool staged) {
  auto held = sched::lock();
  const auto q = sched::queue_of(s);
  if (!q) return cudaErrorInvalidResourceHandle;
  if (block && sched::capturing_on(q->device)) {  // the legacy stream, beside a capture
    sched::invalidate_captures(q->device, what);
    return cudaErrorStreamCaptureImplicit;
  }
  if (staged && q->capture) {  // a replay would copy the call's bytes again
    sched::invalidate(*q, what + " from pageable memory");
    return cudaErrorStreamCaptureUnsupported;
  }
  const sched::Mark done = sched::submit(held, q, std::move(what), std::move(work));
  if (block) sched::drive(held, {done}, true);
  return cudaSuccess;
}

cudaError_t copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, Stream* s,
                 bool block) {
  if (stream_check(s) != cudaSuccess) return cudaErrorInvalidResourceHandle;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault || !device_range_ok(dst, bytes) ||
      !device_range_ok(src, bytes))
    return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  const int dst_device = device_of(dst, bytes), src_device = device_of(src, bytes);
  std::string what = std::string(block ? "cudaMemcpy" : "cudaMemcpyAsync") + " of " +
                     std::to_string(bytes) + " bytes, " + direction(kind);
  const bool from_host =
      kind == cudaMemcpyHostToDevice || (kind == cudaMemcpyDefault && src_device < 0);
  Work work;
  const bool staged = from_host && !block && !pinned(src, bytes);
  if (staged) {
    const auto* begin = static_cast<const unsigned char*>(src);
    auto staged = std::make_shared<const std::vector<unsigned char>>(begin, begin + bytes);
    work = [=] {
      still_allocated(dst, bytes, dst_device, what);
      races::note(dst, bytes, true);
      std::memcpy(dst, staged->data(), bytes);
      return true;
    };
  } else {
    work = [=] {
      still_allocated(dst, bytes, dst_device, what);
      still_allocated(src, bytes, src_device, what);
      races::note(src, bytes, false);
      races::note(dst, bytes, true);
      std::memmove(dst, src, bytes);
      return true;
    };
  }
  return queue_and_maybe_wait(s, what, std::move(work), block, staged);
}

cudaError_t fill(void* p, int value, std::size_t bytes, Stream* s, bool block) {
  if (stream_check(s) != cudaSuccess) return cudaErrorInvalidResourceHandle;
  if (!device_range_ok(p, bytes)) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  const int device = device_of(p, bytes);
  std::string what = std::string(block ? "cudaMemset" : "cudaMemsetAsync") + " of " +
                     std::to_string(bytes) + " bytes";
  Work work = [=] {
    still_allocated(p, bytes, device, what);
    races::note(p, bytes, true);
    std::memset(p, value, bytes);
    return true;
  };
  return queue_and_maybe_wait(s, what, std::move(work), block, false);
}

}  // namespace

cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                         Stream* s) {
  return copy(dst, src, bytes, kind, s, false);
}
cudaError_t memcpy_blocking(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  return copy(dst, src, bytes, kind, nullptr, true);
}
cudaError_t memset_async(void* p, int value, std::size_t bytes, Stream* s) {
  return fill(p, value, bytes, s, false);
}
cudaError_t memset_blocking(void* p, int value, std::size_t bytes) {
  return fill(p, value, bytes, nullptr, true);
}

}  // namespace pptrain_emu
