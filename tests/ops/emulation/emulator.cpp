// The CUDA emulator's entry points (cuda_emulator.hpp): launch checks and queueing, the
// runtime's error and attribute state, and the calls kernels make, handed to the running
// block.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "emulator_block.hpp"
#include "emulator_streams.hpp"

namespace pptrain_emu {
namespace {

using detail::Launch;

thread_local cudaError_t last_error = cudaSuccess;
thread_local ScheduleOrder order_setting = ScheduleOrder::Alternate;

Launch& in_kernel(const char* what) {
  Launch* current = detail::current_launch();
  if (current == nullptr || current->running() < 0)
    throw std::logic_error(std::string(what) + " called outside an emulated kernel");
  return *current;
}

std::mutex attribute_mutex;
std::map<std::uintptr_t, int>& dynamic_limits() {
  static std::map<std::uintptr_t, int> limits;  // cudaFuncSetAttribute's, process-wide
  return limits;
}

}  // namespace

void set_schedule_order(ScheduleOrder order) { order_setting = order; }
ScheduleOrder schedule_order() { return order_setting; }
cudaError_t take_last_error() { return std::exchange(last_error, cudaSuccess); }
cudaError_t peek_last_error() { return last_error; }

void set_max_dynamic_shared(std::uintptr_t kernel, int bytes) {
  std::lock_guard<std::mutex> lock(attribute_mutex);
  dynamic_limits()[kernel] = bytes;
}

namespace {
std::atomic<unsigned long long> launches{0};
// With PPTRAIN_EMULATED_LAUNCH_COUNT=FILE a process appends its launch count to FILE as
// it exits: two runs that differ by one step differ by that step's launches.
struct LaunchReport {
  ~LaunchReport() {
    if (const char* path = std::getenv("PPTRAIN_EMULATED_LAUNCH_COUNT"))
      if (std::FILE* f = std::fopen(path, "a")) {
        std::fprintf(f, "%llu\n", launches.load());
        std::fclose(f);
      }
  }
} launch_report;
}  // namespace
unsigned long long launch_count() { return launches.load(); }

void run(const LaunchConfig& c, std::uintptr_t kernel, KernelBody body) {
  if (detail::current_launch() != nullptr)
    in_kernel("a launch").fail("a launch from inside a kernel (not emulated)");
  const Dim3 &b = c.block, &g = c.grid;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 ||
      g.y == 0 || g.z == 0 || g.x > 0x7FFFFFFFu || g.y > 65535 || g.z > 65535) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  std::size_t limit = detail::kDefaultDynamicLimit;
  {
    std::lock_guard<std::mutex> lock(attribute_mutex);
    const auto it = dynamic_limits().find(kernel);
    if (it != dynamic_limits().end()) limit = std::max<std::size_t>(limit, it->second);
  }
  if (c.smem > limit) {
    last_error = cudaErrorInvalidValue;
    return;
  }
  if (launch_stream_check(c.stream) != cudaSuccess) {  // not a stream of the current device
    last_error = cudaErrorInvalidResourceHandle;
    return;
  }
  ++launches;
  // The blocks run on the host thread that makes the stream's work due, in the schedule
  // order this thread had at the launch.
  const ScheduleOrder order = order_setting;
  enqueue(c.stream, "kernel launched at " + detail::site(c.where), [c, body, order] {
    thread_local detail::Stacks stacks;
    Launch launch(c, body, order, stacks);
    detail::current_launch() = &launch;
    try {
      launch.run();
    } catch (...) {
      detail::current_launch() = nullptr;
      throw;
    }
    detail::current_launch() = nullptr;
    return true;
  });
}

void sync_block(std::source_location w) { in_kernel("__syncthreads").sync_block(w); }
void sync_warp(const char* what, unsigned mask, void* data, Complete complete, Arrive first,
               std::source_location w) {
  in_kernel(what).sync_warp(what, mask, data, complete, first, w);
}
void defer_to_warp_sync(Apply apply, const void* payload, std::size_t bytes) {
  in_kernel("a deferred write").defer(apply, payload, bytes);
}
int lane_id() {
  Launch& L = in_kernel("a warp intrinsic");
  return L.fiber().lane;
}
void* static_shared(const std::type_info& key, std::size_t bytes, std::size_t align) {
  return in_kernel("__shared__").static_shared(key, bytes, align);
}
void* dynamic_shared_base(std::size_t align) {
  return in_kernel("extern __shared__").dynamic_shared(align);
}
void fail(const char* what) { in_kernel("fail").fail(what); }
void check_vector_access(const void* p, std::size_t bytes) {
  if (reinterpret_cast<std::uintptr_t>(p) % bytes != 0)
    in_kernel("a vector access")
        .fail("a " + std::to_string(bytes) + "-byte vector access that is not " +
              std::to_string(bytes) + "-byte aligned");
}

void complete_ballot(void* const* lanes, unsigned mask) {
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && static_cast<VoteData*>(lanes[l])->predicate) bits |= 1u << l;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) static_cast<VoteData*>(lanes[l])->result = bits;
}

}  // namespace pptrain_emu
