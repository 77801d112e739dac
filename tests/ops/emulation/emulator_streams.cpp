// The emulated runtime's stream scheduler (emulator_schedule.hpp): per-stream queues of
// work that runs only when a host call makes it due. drive() first runs what its targets
// need (their queues up to the targets and what those items wait for), choosing among the
// queues that can progress by a seeded PRNG; when a needed item waits for other processes
// it runs every other runnable item too, as a GPU keeps running other streams.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "cuda_emulator.hpp"
#include "emulator_schedule.hpp"

namespace pptrain_emu {
namespace sched {
namespace {

struct State {
  std::mutex mutex;
  std::condition_variable progress;             // notified when an item completes
  std::vector<std::shared_ptr<Queue>> queues;   // every queue with a handle or work, by id
  std::map<int, std::shared_ptr<Queue>> legacy;  // by device
  std::set<const Stream*> streams;
  std::set<const Event*> events;
  std::uint64_t next_id = 0;
  std::string setting = "0";
  bool synchronous = false;
  std::uint64_t rng = 0;  // splitmix64 state
};

void configure(State& s, const std::string& setting) {
  if (setting == "sync") {
    s.synchronous = true;
  } else {
    std::size_t used = 0;
    std::uint64_t seed = 0;
    try {
      seed = std::stoull(setting, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (setting.empty() || used != setting.size() || setting[0] == '-')
      throw std::invalid_argument("PPTRAIN_EMULATED_STREAM_SEED: \"" + setting +
                                  "\" is neither a non-negative integer nor \"sync\"");
    s.synchronous = false;
    s.rng = seed;
  }
  s.setting = setting;
}

State& state() {
  static State s;
  static const bool configured = [] {
    if (const char* env = std::getenv("PPTRAIN_EMULATED_STREAM_SEED")) configure(s, env);
    return true;
  }();
  (void)configured;
  return s;
}

std::uint64_t next_random(State& s) {
  std::uint64_t z = (s.rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

thread_local bool inside_work = false;  // a work item is running on this thread

bool runnable(const Queue& q) {
  if (q.running || q.items.empty()) return false;
  const auto& after = q.items.front().after;
  return std::all_of(after.begin(), after.end(), [](const Mark& m) { return m.done(); });
}

// How far the targets need each queue (queue -> position), following what the needed
// items wait for.
std::map<Queue*, std::uint64_t> needed(const std::vector<Mark>& targets) {
  std::map<Queue*, std::uint64_t> upto;
  std::vector<Mark> to_visit(targets);
  while (!to_visit.empty()) {
    const Mark m = to_visit.back();
    to_visit.pop_back();
    if (m.done()) continue;
    Queue& q = *m.queue;
    const auto it = upto.try_emplace(&q, q.completed).first;
    for (std::uint64_t i = it->second; i < m.position; ++i)
      for (const Mark& a : q.items[i - q.completed].after) to_visit.push_back(a);
    it->second = std::max(it->second, m.position);
  }
  return upto;
}

void finish(State& s, const std::shared_ptr<Queue>& q) {
  q->items.pop_front();
  ++q->completed;
  if (q->destroyed && q->items.empty())
    s.queues.erase(std::find(s.queues.begin(), s.queues.end(), q));
  s.progress.notify_all();
}

// Runs q's head with the lock released; true once it completed.
bool run_head(State& s, std::unique_lock<std::mutex>& held, const std::shared_ptr<Queue>& q) {
  q->running = true;
  Item& item = q->items.front();  // stays put: others only append to the deque
  races::start_run({{q->id, q->completed + 1}, item.clock, q->device, item.what, q->name()});
  held.unlock();
  bool done = false;
  try {
    inside_work = true;
    done = item.work();
    inside_work = false;
    races::finish_run();
  } catch (...) {
    inside_work = false;
    races::abandon_run();
    held.lock();
    q->running = false;
    finish(s, q);  // a failed item is gone; the failure goes to the caller
    throw;
  }
  held.lock();
  q->running = false;
  if (done) finish(s, q);
  return done;
}

// Tries the group's runnable heads in seeded order until one completes; `waiting` is
// set when one ran and returned false.
bool try_group(State& s, std::unique_lock<std::mutex>& held,
               std::vector<std::shared_ptr<Queue>> group, bool& waiting) {
  while (!group.empty()) {
    const std::size_t pick = next_random(s) % group.size();
    const std::shared_ptr<Queue> q = group[pick];
    group.erase(group.begin() + static_cast<std::ptrdiff_t>(pick));
    if (!runnable(*q)) continue;  // another thread ran it meanwhile
    if (run_head(s, held, q)) return true;
    waiting = true;
  }
  return false;
}

// The host has seen the targets complete: it learns their clocks, and the race detector
// drops what nothing can race with any more.
void host_saw(State& s, const std::vector<Mark>& targets) {
  for (const Mark& m : targets) races::host_saw(m.clock);
  std::vector<races::ClockRef> pending;
  for (const auto& q : s.queues)
    if (!q->items.empty()) pending.push_back(q->items.front().clock);
  races::prune(pending);
}

std::string describe_blocked(const std::map<Queue*, std::uint64_t>& upto) {
  std::ostringstream text;
  for (const auto& [q, position] : upto) {
    if (q->items.empty()) continue;
    text << "\n  " << q->name() << ": \"" << q->items.front().what << "\" waits for";
    for (const Mark& m : q->items.front().after)
      if (!m.done())
        text << " " << m.queue->name() << " to reach item " << m.position << " (at "
             << m.queue->completed << ")";
    if (q->running) text << " (running)";
  }
  return text.str();
}

}  // namespace

std::string Queue::name() const {
  return (legacy ? "the legacy stream" : "stream " + std::to_string(id)) + " of device " +
         std::to_string(device);
}

std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(state().mutex); }

std::shared_ptr<Queue> new_queue(int device, bool blocking) {
  State& s = state();
  auto q = std::make_shared<Queue>();
  q->id = s.next_id++, q->device = device, q->blocking = blocking;
  s.queues.push_back(q);
  return q;
}

std::shared_ptr<Queue> legacy_queue(int device) {
  std::shared_ptr<Queue>& q = state().legacy[device];
  if (!q) q = new_queue(device, true), q->legacy = true;
  return q;
}

std::shared_ptr<Queue> queue_of(Stream* s) {
  if (s == nullptr) return legacy_queue(current_device());
  return live_stream(s) ? s->queue : nullptr;
}
bool live_stream(Stream* s) { return state().streams.count(s) != 0; }
void add_stream(Stream* s) { state().streams.insert(s); }
bool remove_stream(Stream* s) {
  if (s == nullptr || state().streams.erase(s) == 0) return false;
  retire(s->queue);
  return true;
}
void retire(const std::shared_ptr<Queue>& q) {
  State& st = state();
  q->destroyed = true;
  if (q->items.empty() && !q->running) st.queues.erase(std::find(st.queues.begin(), st.queues.end(), q));
}
bool live_event(Event* e) { return e != nullptr && state().events.count(e) != 0; }
void add_event(Event* e) { state().events.insert(e); }
bool remove_event(Event* e) { return e != nullptr && state().events.erase(e) != 0; }

Mark submit(std::unique_lock<std::mutex>& held, const std::shared_ptr<Queue>& q, std::string what,
            Work work, std::vector<Mark> after) {
  State& s = state();
  if (q->capture) {  // recorded for the graph; the callers add no waits while capturing
    capture_node(*q, std::move(what), [work](std::uint64_t) { return work; }, q->capture_tail);
    return Mark{};
  }
  // The legacy stream waits for the blocking streams' work, and they wait for its.
  // (Their completed work too: under the "sync" schedule it ran at its call, which the
  // race detector does not count as the host seeing it.)
  const auto used = [](const std::shared_ptr<Queue>& p) { return p->pushed > 0; };
  if (q->legacy) {
    for (const auto& p : s.queues)
      if (p->device == q->device && !p->legacy && p->blocking && used(p))
        after.push_back(end_of(p));
  } else if (q->blocking) {
    const auto it = s.legacy.find(q->device);
    if (it != s.legacy.end() && used(it->second)) after.push_back(end_of(it->second));
  }
  // What happens before the item: its queue's last item, what it waits for, what the
  // host has seen complete.
  auto clock = std::make_shared<races::Clock>(*races::host_clock());
  if (q->last_clock) clock->join(*q->last_clock);
  for (const Mark& m : after)
    if (m.clock) clock->join(*m.clock);
  clock->advance({q->id, q->pushed + 1});
  q->last_clock = clock;
  q->items.push_back({std::move(what), std::move(work), std::move(after), clock});
  const Mark mark{q, ++q->pushed, clock};
  // Not a synchronisation: the host learns nothing from it.
  if (s.synchronous && !inside_work) drive(held, {mark}, true, false);
  return mark;
}

std::size_t capture_node(Queue& q, std::string what, std::function<Work(std::uint64_t)> work_for,
                         std::vector<std::size_t> deps) {
  std::vector<Node>& nodes = q.capture->nodes;
  nodes.push_back({std::move(what), std::move(work_for), q.capture_lane, std::move(deps)});
  q.capture_tail = {nodes.size() - 1};
  return nodes.size() - 1;
}

Mark end_of(const std::shared_ptr<Queue>& q) { return {q, q->pushed, q->last_clock}; }

bool capturing_on(int device) {
  const auto& queues = state().queues;
  return std::any_of(queues.begin(), queues.end(),
                     [&](const auto& q) { return q->device == device && q->capture; });
}

void end_capture(Capture& capture) {
  capture.ended = true;
  for (const auto& q : state().queues)
    if (q->capture.get() == &capture) {
      q->capture = nullptr;
      q->capture_lane = 0;
      q->capture_tail.clear();
    }
}

void invalidate(Queue& q, const std::string& why) {
  if (q.capture && q.capture->invalidated.empty()) q.capture->invalidated = why;
}

void invalidate_captures(int device, const std::string& why) {
  for (const auto& q : state().queues)
    if (q->device == device) invalidate(*q, why);
}

std::vector<Mark> device_marks(int device) {
  std::vector<Mark> marks;
  for (const auto& q : state().queues)
    if (q->device == device) marks.push_back(end_of(q));
  return marks;
}

bool drive(std::unique_lock<std::mutex>& held, const std::vector<Mark>& targets, bool wait,
           bool host_sees) {
  if (inside_work)
    throw std::logic_error("emulated CUDA: a synchronising call from inside queued stream work");
  State& s = state();
  const auto start = std::chrono::steady_clock::now();
  bool warned = false;
  for (;;) {
    if (std::all_of(targets.begin(), targets.end(), [](const Mark& m) { return m.done(); })) {
      if (host_sees) host_saw(s, targets);
      return true;
    }
    const auto upto = needed(targets);
    std::vector<std::shared_ptr<Queue>> mine, others;
    bool busy = false;
    for (const auto& q : s.queues) {  // in id order
      const bool need = upto.count(q.get()) != 0;
      busy = busy || (need && q->running);
      if (runnable(*q)) (need ? mine : others).push_back(q);
    }
    bool waiting = false;
    if (try_group(s, held, mine, waiting)) continue;
    if (waiting && try_group(s, held, others, waiting)) continue;
    if (!wait) return false;
    if (!waiting && !busy)
      throw std::logic_error("emulated CUDA: stream work that can never run:" +
                             describe_blocked(upto));
    if (!warned && std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
      warned = true;
      std::cerr << "emulated CUDA: still waiting after 60 s for:" << describe_blocked(upto)
                << std::endl;
    }
    s.progress.wait_for(held, std::chrono::microseconds(100));
  }
}

}  // namespace sched

void enqueue(Stream* s, std::string what, Work work) {
  auto held = sched::lock();
  const auto q = sched::queue_of(s);
  if (!q) throw std::invalid_argument("emulated CUDA: " + what + " queued on an invalid stream");
  sched::submit(held, q, std::move(what), std::move(work));
}

void enqueue_together(const std::vector<Stream*>& streams, const std::string& what,
                      const std::function<Work(std::size_t)>& work_of) {
  auto held = sched::lock();
  std::vector<std::shared_ptr<sched::Queue>> queues;
  for (Stream* s : streams) {
    auto q = sched::queue_of(s);
    if (!q) throw std::invalid_argument("emulated CUDA: " + what + " queued on an invalid stream");
    queues.push_back(std::move(q));
  }
  std::vector<sched::Mark> ends;
  for (const auto& q : queues) ends.push_back(sched::end_of(q));
  races::Clock joined;
  for (std::size_t k = 0; k < queues.size(); ++k) {
    std::vector<sched::Mark> after;
    for (std::size_t j = 0; j < queues.size(); ++j)
      if (j != k && ends[j].queue) after.push_back(ends[j]);
    joined.join(*sched::submit(held, queues[k], what, work_of(k), std::move(after)).clock);
  }
  // They complete together: what follows on any of the streams follows all of them.
  const auto after_all = std::make_shared<const races::Clock>(joined);
  for (const auto& q : queues) q->last_clock = after_all;
}

bool capture_together(const std::vector<Stream*>& streams, const std::string& what,
                      const std::function<WorkRecipe(std::size_t)>& recipe_of) {
  auto held = sched::lock();
  std::vector<std::shared_ptr<sched::Queue>> queues;
  for (Stream* s : streams) {
    auto q = sched::queue_of(s);
    if (!q || !q->capture || q->capture != sched::queue_of(streams[0])->capture) return false;
    queues.push_back(std::move(q));
  }
  // Each node starts after what every one of the streams had reached; what follows on
  // any of them follows all of the nodes.
  std::vector<std::size_t> deps, nodes;
  for (const auto& q : queues) deps.insert(deps.end(), q->capture_tail.begin(), q->capture_tail.end());
  for (std::size_t k = 0; k < queues.size(); ++k)
    nodes.push_back(sched::capture_node(*queues[k], what, recipe_of(k), deps));
  for (const auto& q : queues) q->capture_tail = nodes;
  return true;
}

void set_stream_schedule(const std::string& setting) {
  auto held = sched::lock();
  sched::configure(sched::state(), setting);
}

std::string stream_schedule() {
  auto held = sched::lock();
  return sched::state().setting;
}

}  // namespace pptrain_emu
