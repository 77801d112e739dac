// The CUDA emulator's block scheduler: fibers, barriers, warp collectives, shared
// memory, and the checks after each block (emulator_block.hpp).
//
// A fiber starts with setcontext on its own stack and then switches with _setjmp and
// _longjmp, which unlike swapcontext save no signal mask: no system call per switch,
// and a kernel's threads switch at every barrier and warp collective.
#undef _FORTIFY_SOURCE  // its longjmp check refuses a jump to another stack
#include "emulator_block.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "emulator_counters.hpp"
#include "emulator_races.hpp"

namespace pptrain_emu::detail {

std::string site(const std::source_location& w) {
  return std::string(w.file_name()) + ":" + std::to_string(w.line());
}
// The unqualified name of the function around a launch (its launcher, an Ops method's
// kernel-side half): "layernorm_forward" from "void pptrain::...::layernorm_forward(T*, ...)
// [with T = ...]".
std::string launcher(const std::source_location& w) {
  std::string head;  // up to the parameter list, without template arguments
  int depth = 0;
  for (const char ch : std::string(w.function_name())) {
    if (ch == '(' && depth == 0) break;
    if (ch == '<') ++depth;
    if (depth == 0) head += ch;
    if (ch == '>') --depth;
  }
  const std::size_t colon = head.rfind("::"), space = head.rfind(' ');
  const std::size_t from = colon != std::string::npos ? colon + 2
                           : space != std::string::npos ? space + 1
                                                        : 0;
  return head.substr(from);
}
bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         std::strcmp(a.file_name(), b.file_name()) == 0;
}
std::string dims(const UInt3& d) {
  std::ostringstream s;
  s << '(' << d.x << ',' << d.y << ',' << d.z << ')';
  return s.str();
}

void Stacks::reserve(std::size_t n) {
  if (n <= count_) return;
  release();
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  slot_ = kStackBytes + page;
  void* p = mmap(nullptr, n * slot_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("emulator: cannot map fiber stacks");
  base_ = static_cast<char*>(p);
  count_ = n;
  for (std::size_t i = 0; i < n; ++i) mprotect(base_ + i * slot_, page, PROT_NONE);
}

void Stacks::release() {
  if (base_) munmap(base_, count_ * slot_);
  base_ = nullptr;
  count_ = 0;
}

Launch*& current_launch() {
  thread_local Launch* current = nullptr;
  return current;
}

Launch::Launch(const LaunchConfig& c, KernelBody body, ScheduleOrder order, Stacks& stacks)
    : config_(c), body_(body), order_(order), stacks_(stacks) {
  const Dim3& b = c.block;
  threads_ = static_cast<int>(b.x * b.y * b.z);
  fibers_.resize(threads_);
  warps_.resize((threads_ + 31) / 32);
  ready_.assign((threads_ + 63) / 64, 0);
  stacks_.reserve(threads_);
  dynamic_.assign(c.smem + kCanary + 256, kPoison);
  static_.assign(kStaticSharedLimit + 64 * kCanary + 256, kPoison);
  mark_shared(true);
  auto range = [](std::vector<unsigned char>& v) {
    const auto p = reinterpret_cast<std::uintptr_t>(v.data());
    return counters::Range{p, p + v.size()};
  };
  counters::begin_kernel(site(c.where) + " " + launcher(c.where), range(dynamic_), range(static_));
}

Launch::~Launch() {
  counters::end_kernel();
  mark_shared(false);
}

void Launch::mark_shared(bool mark) {
  for (std::vector<unsigned char>* v : {&dynamic_, &static_}) {
    const auto p = reinterpret_cast<std::uintptr_t>(v->data());
    const std::uintptr_t lo = (p + 7) / 8 * 8, hi = (p + v->size()) / 8 * 8;
    if (hi > lo) races::mark_device_memory(reinterpret_cast<void*>(lo), hi - lo, mark);
  }
}

void Launch::run() {
  const Dim3& g = config_.grid;
  std::size_t linear = 0;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x, ++linear) run_block({x, y, z}, linear);
}

void Launch::fail(const std::string& what) {
  throw std::runtime_error(describe() + ": thread " + dims(fiber().tid) + ": " + what);
}

std::string Launch::describe() const {
  return "kernel launched at " + site(config_.where) + " in " + config_.where.function_name() +
         ": block " + dims(block_);
}

void Launch::make_runnable(int i) {
  fibers_[i].state = Fiber::State::Runnable;
  ready_[rank(i) / 64] |= 1ull << (rank(i) % 64);
}

int Launch::next_runnable() {
  for (std::size_t k = 0; k < ready_.size(); ++k)
    if (ready_[k]) {
      const int r = static_cast<int>(k * 64) + std::countr_zero(ready_[k]);
      ready_[k] &= ready_[k] - 1;
      return rank(r);  // rank() is its own inverse
    }
  return -1;
}

void Launch::suspend(Fiber::State s, const char* what, std::source_location w) {
  Fiber& f = fiber();
  if (s == Fiber::State::Runnable) make_runnable(running_);
  f.state = s, f.waiting = what, f.where = w;
  if (_setjmp(f.resume) == 0) _longjmp(host_, 1);
}

void Launch::release_block() {
  for (int i = 0; i < threads_; ++i)
    if (fibers_[i].state == Fiber::State::AtBarrier) make_runnable(i);
  arrived_ = 0;
}

void* Launch::dynamic_shared(std::size_t align) {
  if (align > 256) fail("dynamic shared memory aligned to more than 256 bytes");
  return dynamic_base();
}

bool Launch::in_shared(const void* p, std::size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  auto within = [&](unsigned char* base, std::size_t size) {
    return b >= base && b + bytes <= base + size;
  };
  return within(dynamic_base(), config_.smem) || within(static_base(), static_used_);
}

void Launch::defer(Apply apply, const void* payload, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(payload);
  warps_[fiber().warp].deferred.emplace_back(apply, std::vector<unsigned char>(p, p + bytes));
}

void Launch::sync_block(std::source_location w) {
  warps_[fiber().warp].flush();
  if (arrived_ == 0) {
    barrier_site_ = w;
  } else if (!same_site(barrier_site_, w)) {
    fail("__syncthreads at " + site(w) + " while others wait at " + site(barrier_site_) +
         " (a barrier in divergent code)");
  }
  if (++arrived_ == live_) {
    release_block();
    suspend(Fiber::State::Runnable, "", w);
  } else {
    suspend(Fiber::State::AtBarrier, "__syncthreads", w);
  }
}

void Launch::sync_warp(const char* what, unsigned mask, void* data, Complete complete, Arrive first,
                       std::source_location w) {
  Fiber& f = fiber();
  Warp& W = warps_[f.warp];
  W.flush();
  const unsigned bit = 1u << f.lane;
  if (mask & ~W.exists) fail(std::string(what) + ": the mask names lanes the block lacks");
  if (!(mask & bit)) fail(std::string(what) + ": the calling lane is not in the mask");
  if (mask & W.exited) fail(std::string(what) + ": the mask names lanes that have exited");
  if (W.pending == 0) {
    W.pending = mask, W.arrived = 0, W.what = what, W.complete = complete, W.where = w;
    if (first) first(data);
  } else if (W.pending != mask || std::strcmp(W.what, what) != 0) {
    fail(std::string(what) + " at " + site(w) + " while lanes of its warp wait in " + W.what +
         " at " + site(W.where) + " (divergent or different masks)");
  }
  W.data[f.lane] = data;
  W.arrived |= bit;
  if (W.arrived != W.pending) return suspend(Fiber::State::InWarpOp, what, w);
  if (W.complete) W.complete(W.data, mask);
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) make_runnable(f.warp * 32 + l);
  W.pending = 0;
  suspend(Fiber::State::Runnable, "", w);
}

void* Launch::static_shared(const std::type_info& key, std::size_t bytes, std::size_t align) {
  for (const StaticEntry& e : entries_)
    if (*e.key == key) return static_base() + e.offset;
  const std::size_t offset = (static_used_ + std::max<std::size_t>(align, 16) - 1) /
                             std::max<std::size_t>(align, 16) * std::max<std::size_t>(align, 16);
  static_bytes_ += bytes;
  if (static_bytes_ > kStaticSharedLimit || offset + bytes + kCanary + 256 > static_.size())
    fail("static shared memory over 48 KiB");
  if (static_bytes_ + config_.smem > kSharedLimit) fail("shared memory over 227 KiB");
  std::fill_n(static_base() + offset, bytes + kCanary, kPoison);
  entries_.push_back({&key, offset, bytes});
  static_used_ = offset + bytes + kCanary;
  return static_base() + offset;
}

void Launch::exit_current() {
  Fiber& f = fiber();
  f.state = Fiber::State::Done;
  Warp& W = warps_[f.warp];
  W.flush();
  W.exited |= 1u << f.lane;
  if (W.pending & (1u << f.lane))
    fail(std::string("exited while its warp waits in ") + W.what + " at " + site(W.where));
  --live_;
  if (arrived_ > 0 && arrived_ == live_) release_block();
}

void Launch::entry() {
  Launch* L = current_launch();
  try {
    L->body_.call(L->body_.context.get());
    L->exit_current();
  } catch (const std::exception& e) {
    L->error_ = e.what();
  } catch (...) {
    L->error_ = "unknown exception";
  }
  L->fiber().state = Fiber::State::Done;
  _longjmp(L->host_, 1);  // back to the scheduler; this stack is not resumed
}

void Launch::run_block(UInt3 block, std::size_t linear) {
  block_ = block;
  const Dim3& b = config_.block;
  std::fill_n(dynamic_base(), config_.smem + kCanary, kPoison);
  entries_.clear();
  static_used_ = static_bytes_ = 0;
  for (int i = 0; i < threads_; ++i) {
    Fiber& f = fibers_[i];
    const unsigned u = static_cast<unsigned>(i);
    f = Fiber{};
    f.tid = {u % b.x, u / b.x % b.y, u / (b.x * b.y)};
    f.warp = i / 32, f.lane = i % 32;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stacks_.top(i) - kStackBytes;
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;  // entry never returns
    makecontext(&f.context, &Launch::entry, 0);
  }
  for (std::size_t w = 0; w < warps_.size(); ++w) {
    const int lanes = std::min(32, threads_ - static_cast<int>(w) * 32);
    warps_[w] = Warp{};
    warps_[w].exists = lanes == 32 ? 0xFFFFFFFFu : (1u << lanes) - 1u;
  }
  live_ = threads_, arrived_ = 0;
  descending_ = order_ == ScheduleOrder::Descending ||
                (order_ == ScheduleOrder::Alternate && linear % 2 == 1);
  for (int i = 0; i < threads_; ++i) make_runnable(i);
  blockIdx = block;
  blockDim = config_.block;
  gridDim = config_.grid;
  for (int i = next_runnable(); i >= 0; i = next_runnable()) {
    running_ = i;
    Fiber& f = fibers_[i];
    threadIdx = f.tid;
    if (_setjmp(host_) == 0) {
      if (!f.started) {
        f.started = true;
        setcontext(&f.context);
      }
      _longjmp(f.resume, 1);
    }
    if (!error_.empty()) throw std::runtime_error(error_);
  }
  if (live_ > 0) deadlock();
  running_ = -1;
  for (Warp& W : warps_) W.flush();
  check_canaries();
}

void Launch::check_canaries() {
  auto poisoned = [](const unsigned char* p, std::size_t n) {
    return std::all_of(p, p + n, [](unsigned char c) { return c == kPoison; });
  };
  if (!poisoned(dynamic_base() + config_.smem, kCanary))
    throw std::runtime_error(describe() + ": a write past the dynamic shared memory");
  for (const StaticEntry& e : entries_)
    if (!poisoned(static_base() + e.offset + e.bytes, kCanary))
      throw std::runtime_error(describe() + ": a write past a static __shared__ array");
}

void Launch::deadlock() {
  // The waiting threads grouped by where they wait, in thread order.
  struct Group {
    const Fiber* first;
    int count;
  };
  std::vector<Group> groups;
  for (const Fiber& f : fibers_) {
    if (f.state == Fiber::State::Done) continue;
    auto same = [&](const Group& g) {
      return g.first->state == f.state && same_site(g.first->where, f.where);
    };
    const auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end())
      groups.push_back({&f, 1});
    else
      ++it->count;
  }
  std::ostringstream s;
  s << describe() << ": deadlock; threads waiting:";
  for (const Group& g : groups)
    s << " " << g.count << " (from " << dims(g.first->tid) << ") in " << g.first->waiting << " at "
      << site(g.first->where) << ";";
  throw std::runtime_error(s.str());
}

}  // namespace pptrain_emu::detail
