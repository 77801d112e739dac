// The CUDA emulator's internals (model and limits in cuda_emulator.hpp): a launch runs
// its blocks one after another; a block's threads are fibers (ucontext) on the calling
// thread. A fiber runs until it waits at a barrier or a warp collective or exits; then
// the first runnable fiber in the block's order runs (depth first: one warp runs ahead of
// the others as far as the barriers let it). Shared memory is poisoned before each block
// and fenced by canaries checked after it.
#pragma once
#include <ucontext.h>

#include <csetjmp>

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "cuda_emulator.hpp"

namespace pptrain_emu::detail {

constexpr std::size_t kStackBytes = 256 * 1024;        // per thread, below a guard page
constexpr std::size_t kStaticSharedLimit = 48 * 1024;  // static __shared__ per block
constexpr std::size_t kDefaultDynamicLimit = 48 * 1024;
constexpr std::size_t kSharedLimit = 227 * 1024;  // opt-in maximum per block (sm_90)
constexpr std::size_t kCanary = 64;               // poisoned bytes after each region
constexpr unsigned char kPoison = 0xFF;           // a NaN as float, double and bf16

std::string site(const std::source_location& w);
bool same_site(const std::source_location& a, const std::source_location& b);
std::string dims(const UInt3& d);

// Fiber stacks, kept per OS thread and grown as launches need more threads.
class Stacks {
 public:
  Stacks() = default;
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  ~Stacks() { release(); }
  char* top(std::size_t i) { return base_ + (i + 1) * slot_; }
  void reserve(std::size_t n);  // room for n stacks, each above a guard page

 private:
  void release();
  char* base_ = nullptr;
  std::size_t count_ = 0, slot_ = 0;
};

// A cp.async copy in flight (emulator_ptx.hpp): its 16 bytes, read at the copy, land
// at the wait that covers its group.
struct AsyncCopy {
  void* dst;
  unsigned char bytes[16];
};

struct Fiber {
  enum class State { Runnable, AtBarrier, InWarpOp, Done };
  ucontext_t context;  // its start (entry on its own stack)
  std::jmp_buf resume;  // where it suspended
  bool started = false;
  UInt3 tid;
  int warp = 0, lane = 0;
  State state = State::Runnable;
  const char* waiting = "";  // what a blocked fiber waits in, and where
  std::source_location where;
  std::vector<AsyncCopy> copies;   // cp.async copies not landed, oldest first
  std::vector<std::size_t> groups;  // the end of each committed group in `copies`
};

// A warp collective being gathered, and the writes waiting for the warp's next sync.
struct Warp {
  unsigned exists = 0, exited = 0, pending = 0, arrived = 0;
  const char* what = "";
  Complete complete = nullptr;
  std::source_location where;
  void* data[32] = {};
  std::vector<std::pair<Apply, std::vector<unsigned char>>> deferred;
  void flush() {
    for (const auto& [apply, payload] : deferred) apply(payload.data());
    deferred.clear();
  }
};

struct StaticEntry {
  const std::type_info* key;
  std::size_t offset, bytes;
};

class Launch;
// The launch running on this thread (null outside launches).
Launch*& current_launch();

// One launch: its blocks one after another (emulator_block.cpp).
class Launch {
 public:
  Launch(const LaunchConfig& c, KernelBody body, ScheduleOrder order, Stacks& stacks);
  ~Launch();
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
  void run();

  // The calls a running fiber makes.
  Fiber& fiber() { return fibers_[running_]; }
  int running() const { return running_; }
  void sync_block(std::source_location w);
  void sync_warp(const char* what, unsigned mask, void* data, Complete complete, Arrive first,
                 std::source_location w);
  void* static_shared(const std::type_info& key, std::size_t bytes, std::size_t align);
  void* dynamic_shared(std::size_t align);
  void defer(Apply apply, const void* payload, std::size_t bytes);
  // True when [p, p + bytes) lies in the block's shared memory.
  bool in_shared(const void* p, std::size_t bytes);
  [[noreturn]] void fail(const std::string& what);

 private:
  static void entry();  // a fiber's start
  void run_block(UInt3 block, std::size_t linear);
  void exit_current();
  void check_canaries();
  [[noreturn]] void deadlock();
  std::string describe() const;  // the launch site and block

  // The shared-memory regions start 256-byte aligned within their buffers.
  static unsigned char* aligned(std::vector<unsigned char>& v) {
    const auto p = reinterpret_cast<std::uintptr_t>(v.data());
    return v.data() + (256 - p % 256) % 256;
  }
  unsigned char* dynamic_base() { return aligned(dynamic_); }
  // Marks the shared buffers in the access shadow (emulator_counters.hpp), or unmarks.
  void mark_shared(bool mark);
  unsigned char* static_base() { return aligned(static_); }

  // Ranks order the fibers: thread index ascending, or descending.
  int rank(int i) const { return descending_ ? threads_ - 1 - i : i; }
  void make_runnable(int i);
  int next_runnable();  // the first runnable fiber in rank order, or -1
  void suspend(Fiber::State s, const char* what, std::source_location w);
  void release_block();

  LaunchConfig config_;
  KernelBody body_;
  ScheduleOrder order_;
  Stacks& stacks_;
  std::jmp_buf host_;  // the scheduler, while a fiber runs
  std::string error_;  // what a fiber threw
  int threads_ = 0, live_ = 0, arrived_ = 0, running_ = -1;
  bool descending_ = false;
  std::vector<std::uint64_t> ready_;  // runnable fibers, a bit per rank
  UInt3 block_;
  std::vector<Fiber> fibers_;
  std::vector<Warp> warps_;
  std::source_location barrier_site_;
  std::vector<unsigned char> dynamic_, static_;
  std::vector<StaticEntry> entries_;
  std::size_t static_used_ = 0, static_bytes_ = 0;
};

}  // namespace pptrain_emu::detail
