// The emulated runtime's stream-ordering race detector (emulator_races.cpp).
//
// Every stream item gets a vector clock when it is queued: its stream's previous item,
// the items it waits for (event waits, the legacy stream's ordering) and what the host
// had seen complete (synchronisations, successful queries) all happen before it. While
// an item runs, its accesses to device memory are recorded byte by byte: the kernels'
// loads and stores through compiler instrumentation, and by note() what copies, memsets,
// cuBLASLt's products and the emulated NCCL's operations read and write. The emulated
// kernel sources are built with GCC's -fsanitize=thread instrumentation: every load and
// store (both of a read-modify-write) calls a __tsan_* function defined here, which reads
// the address's shadow byte ((address >> 3) + kShadowOffset), set for device allocations
// only (mark_device_memory). Two accesses to the same byte by items of different streams,
// one of them a write, where neither item happens before the other, are a race: the
// item running when it is found fails with a message naming both items and the
// allocation, and the message is printed too. A 16-byte access to device memory that is
// not 16-byte aligned fails at once, as it faults on a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pptrain_emu::races {

// The position of an item in its queue (positions count from 1).
struct Epoch {
  std::uint64_t queue = 0, position = 0;
};

// For each queue, the last position known to happen before (sorted by queue id).
class Clock {
 public:
  void join(const Clock& other);
  void advance(Epoch e);  // e itself happens before too
  bool covers(Epoch e) const;
  std::uint64_t of(std::uint64_t queue) const;

 private:
  std::vector<std::pair<std::uint64_t, std::uint64_t>> known_;
};
using ClockRef = std::shared_ptr<const Clock>;

// The host's clock: what it has seen complete; a new item's clock starts from it.
ClockRef host_clock();
void host_saw(const ClockRef& clock);

// The item that starts running on this thread, until finish_run(). finish_run checks
// the accesses of this run against those of other streams' items that do not happen
// before it, throws std::logic_error on a race, and keeps them for later items.
struct Running {
  Epoch epoch;
  ClockRef clock;
  int device = 0;
  std::string what;   // the item, as the scheduler names it
  std::string queue;  // the queue's name
};
void start_run(Running item);
void finish_run();
void abandon_run();  // the item threw: its accesses are dropped

// An access by the running item (none: ignored) to [p, p + bytes); ranges outside the
// device allocations are host memory and ignored. `by`, if set, names the part of the
// item that made it (an operation of an NCCL group), for the report.
void note(const void* p, std::size_t bytes, bool write, const char* by = nullptr);

// Drops what no item can race with any more: records of items that happen before the
// host's clock and before every pending item (`pending`: the clocks of the queues'
// heads).
void prune(const std::vector<ClockRef>& pending);

// The shadow's place and its marking of [p, p + bytes) as device memory or not (p and
// bytes multiples of 8).
constexpr std::uintptr_t kShadowOffset = 0x7fff8000;
void mark_device_memory(const void* p, std::size_t bytes, bool device);

// An allocation was freed: what was recorded of it goes.
void forget(const void* base);

// The live device allocations (emulator_host.cpp): (base, bytes), sorted by base, as of
// the registry's version `version`.
struct AllocationList {
  std::uint64_t version = ~std::uint64_t(0);
  std::vector<std::pair<const char*, std::size_t>> spans;
};
void refresh_allocations(AllocationList& list);  // rereads it when the registry changed

// On unless PPTRAIN_EMULATED_RACES=0 (to measure what the detector costs, or to show
// what the seeded orders catch without it). A race is reported once: what was kept of
// its allocation is dropped.
bool enabled();
void set_enabled(bool on);

}  // namespace pptrain_emu::races
