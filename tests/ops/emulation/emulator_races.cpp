// The stream-ordering race detector (emulator_races.hpp). A running item's accesses are
// bits in pages of 4 KiB per allocation it touched; when the run ends they become sorted
// spans, are compared with the kept records of the same allocation, and are kept.
#include "emulator_races.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "emulator_counters.hpp"
#include "emulator_runtime.hpp"  // fail

namespace pptrain_emu::races {

void Clock::join(const Clock& other) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> merged;
  merged.reserve(known_.size() + other.known_.size());
  auto a = known_.cbegin();
  auto b = other.known_.cbegin();
  while (a != known_.cend() || b != other.known_.cend()) {
    if (b == other.known_.cend() || (a != known_.cend() && a->first < b->first)) {
      merged.push_back(*a++);
    } else if (a == known_.cend() || b->first < a->first) {
      merged.push_back(*b++);
    } else {
      merged.emplace_back(a->first, std::max(a->second, b->second));
      ++a, ++b;
    }
  }
  known_ = std::move(merged);
}

void Clock::advance(Epoch e) {
  Clock one;
  one.known_.emplace_back(e.queue, e.position);
  join(one);
}

std::uint64_t Clock::of(std::uint64_t queue) const {
  const auto it = std::lower_bound(known_.begin(), known_.end(), std::make_pair(queue, std::uint64_t(0)));
  return it != known_.end() && it->first == queue ? it->second : 0;
}

bool Clock::covers(Epoch e) const { return of(e.queue) >= e.position; }

namespace {

using Span = std::pair<std::size_t, std::size_t>;  // [begin, end) offsets in an allocation

struct Record {
  Epoch epoch;
  std::string what, queue;
  std::vector<Span> reads, writes;
};

struct Shared {
  std::mutex mutex;
  ClockRef host = std::make_shared<Clock>();
  std::map<const char*, std::vector<Record>> records;  // by allocation base
};
Shared& shared() {
  static Shared s;
  return s;
}

constexpr std::size_t kPageBytes = 4096;
using Page = std::array<std::uint64_t, kPageBytes / 64>;

struct Touched {
  const char* base;
  std::size_t bytes;
  std::vector<std::unique_ptr<Page>> read, written;  // by page; null: untouched
  std::string by;  // the part of the item that touched it first, when named
};

struct Tracker {
  Running item;
  std::deque<Touched> touched;  // a deque: `hit` stays valid as it grows
  Touched* hit = nullptr;       // the allocation of the last access, and its bytes' range
  const char *hit_lo = nullptr, *hit_hi = nullptr;
  AllocationList allocations;
  // Two ranges known to hold no allocation (shared memory, the fibers' stacks), the
  // older one replaced first.
  std::pair<const char*, const char*> gaps[2] = {};
  int older_gap = 0;
};
Tracker& thread_tracker() {
  thread_local Tracker t;
  return t;
}
// The thread's tracker while an item runs (trivially initialised: no TLS wrapper call on
// the accesses' path).
thread_local Tracker* active = nullptr;

// An access's slow path: the allocation holding `at`, or null for host memory.
Touched* find_touched(Tracker& tracker, const char* at) {
  for (const auto& [lo, hi] : tracker.gaps)
    if (at >= lo && at < hi) return nullptr;
  const auto& spans = tracker.allocations.spans;
  auto it = std::upper_bound(spans.begin(), spans.end(), at,
                             [](const char* x, const auto& s) { return x < s.first; });
  if (it == spans.begin() || at >= std::prev(it)->first + std::prev(it)->second) {
    const char* lo = it == spans.begin() ? nullptr : std::prev(it)->first + std::prev(it)->second;
    const char* hi = it == spans.end() ? reinterpret_cast<const char*>(~std::uintptr_t(0)) : it->first;
    tracker.gaps[tracker.older_gap] = {lo, hi};
    tracker.older_gap ^= 1;
    return nullptr;
  }
  --it;
  for (std::size_t i = 0; i < tracker.touched.size(); ++i)
    if (tracker.touched[i].base == it->first) return &tracker.touched[i];
  const std::size_t pages = (it->second + kPageBytes - 1) / kPageBytes;
  tracker.touched.push_back({it->first, it->second, {}, {}, {}});
  tracker.touched.back().read.resize(pages), tracker.touched.back().written.resize(pages);
  return &tracker.touched.back();
}

// Sets the bits of bytes [begin, end), a word (64 bytes' bits) at a time.
void mark(std::vector<std::unique_ptr<Page>>& pages, std::size_t begin, std::size_t end) {
  while (begin < end) {
    auto& page = pages[begin / kPageBytes];
    if (!page) page = std::make_unique<Page>(), page->fill(0);
    const std::size_t word_end = std::min(end, (begin / 64 + 1) * 64);
    const std::size_t n = word_end - begin, shift = begin % 64;
    const std::uint64_t bits = n == 64 ? ~std::uint64_t(0) : ((std::uint64_t(1) << n) - 1) << shift;
    (*page)[(begin % kPageBytes) / 64] |= bits;
    begin = word_end;
  }
}

std::vector<Span> spans_of(const std::vector<std::unique_ptr<Page>>& pages) {
  std::vector<Span> spans;
  for (std::size_t p = 0; p < pages.size(); ++p) {
    if (!pages[p]) continue;
    for (std::size_t bit = 0; bit < kPageBytes; ++bit) {
      if (!(((*pages[p])[bit / 64] >> (bit % 64)) & 1)) continue;
      const std::size_t at = p * kPageBytes + bit;
      if (!spans.empty() && spans.back().second == at)
        ++spans.back().second;
      else
        spans.emplace_back(at, at + 1);
    }
  }
  return spans;
}

// The first byte range both sorted span lists hold, if any.
bool overlap(const std::vector<Span>& a, const std::vector<Span>& b, Span* where) {
  auto i = a.begin(), j = b.begin();
  while (i != a.end() && j != b.end()) {
    const std::size_t lo = std::max(i->first, j->first), hi = std::min(i->second, j->second);
    if (lo < hi) return *where = {lo, hi}, true;
    (i->second < j->second ? i : j)++;
  }
  return false;
}

std::string describe(const std::string& queue, const std::string& what, Epoch e) {
  return queue + "'s \"" + what + "\" (item " + std::to_string(e.position) + ")";
}

std::string race_text(const Record& mine, const Record& theirs, const char* mine_did,
                      const char* theirs_did, Span bytes, const char* base,
                      std::size_t allocation_bytes) {
  std::ostringstream text;
  text << "emulated CUDA: stream race: " << describe(mine.queue, mine.what, mine.epoch) << " "
       << mine_did << " bytes [" << bytes.first << ", " << bytes.second << ") of the "
       << allocation_bytes << "-byte device allocation at " << static_cast<const void*>(base)
       << ", which " << describe(theirs.queue, theirs.what, theirs.epoch) << " " << theirs_did
       << ", and no event wait or synchronisation orders the two";
  return text.str();
}

// The first race between `mine` and a kept record, or "".
std::string first_race(const Record& mine, const Clock& clock, const std::vector<Record>& kept,
                       const char* base, std::size_t allocation_bytes) {
  for (const Record& theirs : kept) {
    if (theirs.epoch.queue == mine.epoch.queue || clock.covers(theirs.epoch)) continue;
    Span bytes;
    if (overlap(mine.writes, theirs.writes, &bytes))
      return race_text(mine, theirs, "writes", "wrote", bytes, base, allocation_bytes);
    if (overlap(mine.writes, theirs.reads, &bytes))
      return race_text(mine, theirs, "writes", "read", bytes, base, allocation_bytes);
    if (overlap(mine.reads, theirs.writes, &bytes))
      return race_text(mine, theirs, "reads", "wrote", bytes, base, allocation_bytes);
  }
  return "";
}

std::atomic<bool>& switched_on() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("PPTRAIN_EMULATED_RACES");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

}  // namespace

bool enabled() { return switched_on(); }
void set_enabled(bool on) { switched_on() = on; }

ClockRef host_clock() {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.host;
}

void host_saw(const ClockRef& clock) {
  if (!clock) return;
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto joined = std::make_shared<Clock>(*s.host);
  joined->join(*clock);
  s.host = std::move(joined);
}

void start_run(Running item) {
  if (!enabled()) return;
  Tracker& tracker = thread_tracker();
  refresh_allocations(tracker.allocations);
  tracker.item = std::move(item);
  tracker.touched.clear();
  tracker.hit = nullptr, tracker.hit_lo = tracker.hit_hi = nullptr;
  for (auto& gap : tracker.gaps) gap = {};
  active = &tracker;
}

void abandon_run() {
  if (active != nullptr) active->touched.clear();
  active = nullptr;
}

void note(const void* p, std::size_t bytes, bool write, const char* by) {
  Tracker* const tracker = active;
  if (tracker == nullptr || bytes == 0) return;
  const char* at = static_cast<const char*>(p);
  Touched* t = at >= tracker->hit_lo && at < tracker->hit_hi ? tracker->hit : nullptr;
  if (t == nullptr && (t = find_touched(*tracker, at)) == nullptr) return;
  tracker->hit = t, tracker->hit_lo = t->base, tracker->hit_hi = t->base + t->bytes;
  if (by != nullptr && t->by.empty()) t->by = by;
  const std::size_t begin = std::size_t(at - t->base);
  const std::size_t end = std::min(t->bytes, begin + bytes);
  mark(write ? t->written : t->read, begin, end);
}

void finish_run() {
  if (active == nullptr) return;
  Tracker& tracker = *active;
  active = nullptr;
  const Running& item = tracker.item;
  Shared& s = shared();
  std::string race;
  for (const Touched& t : tracker.touched) {
    const bool named = !t.by.empty() && t.by != item.what;
    Record mine{item.epoch, named ? item.what + ": " + t.by : item.what, item.queue,
                spans_of(t.read), spans_of(t.written)};
    std::lock_guard<std::mutex> lock(s.mutex);
    auto& kept = s.records[t.base];
    race = first_race(mine, *item.clock, kept, t.base, t.bytes);
    if (!race.empty()) {  // reported once: what was kept of the allocation goes
      s.records.erase(t.base);
      break;
    }
    kept.push_back(std::move(mine));
  }
  tracker.touched.clear();
  if (race.empty()) return;
  std::cerr << race << std::endl;
  throw std::logic_error(race);
}

void prune(const std::vector<ClockRef>& pending) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto settled = [&](const Record& r) {
    return s.host->covers(r.epoch) &&
           std::all_of(pending.begin(), pending.end(),
                       [&](const ClockRef& c) { return c && c->covers(r.epoch); });
  };
  for (auto it = s.records.begin(); it != s.records.end();) {
    auto& kept = it->second;
    kept.erase(std::remove_if(kept.begin(), kept.end(), settled), kept.end());
    it = kept.empty() ? s.records.erase(it) : std::next(it);
  }
}

namespace {
// The shadow of the whole user address space (2^47 bytes: 2^44 shadow bytes), reserved
// without backing; only device allocations' shadow is ever written. Made before main, so
// before any instrumented code runs.
unsigned char* shadow_of(const void* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(p) >> 3) +
                                          kShadowOffset);
}
const bool shadow_mapped = [] {
  void* want = reinterpret_cast<void*>(kShadowOffset);
  void* got = mmap(want, std::size_t(1) << 44, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got != want) {
    std::cerr << "emulated CUDA: cannot map the race detector's shadow memory at "
              << want << std::endl;
    std::abort();
  }
  return true;
}();
}  // namespace

void mark_device_memory(const void* p, std::size_t bytes, bool device) {
  (void)shadow_mapped;
  std::memset(shadow_of(p), device ? 0xFF : 0, bytes / 8);  // 0xFF: no byte addressable
}

void forget(const void* base) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.records.erase(static_cast<const char*>(base));
}

}  // namespace pptrain_emu::races

// GCC's -fsanitize=thread instrumentation, without its runtime: the instrumented files
// call a function before every load and store (a read-modify-write statement both, where
// the address sanitizer's checks see only its read); those of device memory (a set
// shadow byte) go to the detector and the counters.
namespace {
void device_access(std::uintptr_t a, std::size_t n, bool write) {
  // A GPU faults on a misaligned 16-byte vector access; so does the emulator.
  if (n == 16 && a % 16 != 0)
    pptrain_emu::fail("a 16-byte vector access to device memory that is not 16-byte aligned");
  if (pptrain_emu::counters::shared_access(a, n, write)) return;  // marked too: counted only
  pptrain_emu::counters::global_access(n, write);
  pptrain_emu::races::note(reinterpret_cast<const void*>(a), n, write);
}
void access(std::uintptr_t a, std::size_t n, bool write) {
  const auto* shadow = reinterpret_cast<const unsigned char*>((a >> 3) + pptrain_emu::races::kShadowOffset);
  if (*shadow != 0 || shadow[(n - 1 + (a & 7)) >> 3] != 0) device_access(a, n, write);
}
}  // namespace
extern "C" {
#define PPTRAIN_EMU_ACCESS(size)                                                        \
  void __tsan_read##size(void* a) { access(reinterpret_cast<std::uintptr_t>(a), size, false); } \
  void __tsan_write##size(void* a) { access(reinterpret_cast<std::uintptr_t>(a), size, true); }  \
  void __tsan_unaligned_read##size(void* a) {                                          \
    access(reinterpret_cast<std::uintptr_t>(a), size, false);                          \
  }                                                                                    \
  void __tsan_unaligned_write##size(void* a) {                                         \
    access(reinterpret_cast<std::uintptr_t>(a), size, true);                           \
  }
PPTRAIN_EMU_ACCESS(1)
PPTRAIN_EMU_ACCESS(2)
PPTRAIN_EMU_ACCESS(4)
PPTRAIN_EMU_ACCESS(8)
PPTRAIN_EMU_ACCESS(16)
#undef PPTRAIN_EMU_ACCESS
void __tsan_read_range(void* a, std::size_t n) {
  if (n) access(reinterpret_cast<std::uintptr_t>(a), n, false);
}
void __tsan_write_range(void* a, std::size_t n) {
  if (n) access(reinterpret_cast<std::uintptr_t>(a), n, true);
}
// The atomics the emulated kernels use (the memory order argument is ignored: all are
// sequentially consistent); a read-modify-write counts as a write.
int __tsan_atomic32_fetch_add(volatile int* a, int v, int) {
  access(reinterpret_cast<std::uintptr_t>(a), 4, true);
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
char __tsan_atomic8_load(const volatile char* a, int) {
  access(reinterpret_cast<std::uintptr_t>(a), 1, false);
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
void __tsan_vptr_update(void**, void*) {}
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
}
