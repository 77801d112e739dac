// The emulated runtime's queues (emulator_streams.cpp), shared by the files that queue
// work and make it due (emulator_stream_api.cpp, emulator_copies.cpp). A
// stream is a FIFO of items; an item may start once it is at the head of its queue and
// every mark it waits for is done. Everything here is guarded by one mutex (lock()).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "emulator_races.hpp"
#include "emulator_streams.hpp"

namespace pptrain_emu::sched {

struct Queue;
// A point in a queue: done once the queue has completed `position` items. A mark
// without a queue is always done (an event never recorded). `clock`: the race
// detector's clock of the item at `position` (what happens before it).
struct Mark {
  std::shared_ptr<Queue> queue;
  std::uint64_t position = 0;
  races::ClockRef clock;
  bool done() const;
};

struct Item {
  std::string what;
  Work work;
  std::vector<Mark> after;  // what must be done before the item starts
  races::ClockRef clock;    // what happens before it, itself included
};

// A stream capture in progress (emulator_graphs.cpp): what is queued on the capturing
// streams is recorded here as the nodes of a graph, not run. Lane 0 is the stream that
// began the capture; another stream joins it, as a lane of its own, by waiting for an
// event recorded in it. A node depends on what its stream had reached when it was queued
// (its lane's tail), and its work is made anew for each launch (work_for).
struct Node {
  std::string what;
  std::function<Work(std::uint64_t launch)> work_for;
  std::size_t lane = 0;
  std::vector<std::size_t> deps;  // earlier nodes
};
struct Capture {
  std::vector<Node> nodes;
  std::size_t lanes = 1;
  bool ended = false;
  std::string invalidated;  // the call capture does not allow, once one was made
};

struct Queue {
  std::uint64_t id = 0;  // creation order: names queues and orders the seeded choice
  int device = 0;
  bool legacy = false;     // the device's legacy default stream (the null stream)
  bool blocking = true;    // created without cudaStreamNonBlocking: ordered with the legacy stream
  bool destroyed = false;  // the handle is gone; the queue lives until its work has run
  bool running = false;    // its head is running on some host thread
  std::deque<Item> items;  // not yet completed, the head first
  std::uint64_t pushed = 0, completed = 0;
  races::ClockRef last_clock;  // the clock of item `pushed`
  std::shared_ptr<Capture> capture;  // while the stream captures
  std::size_t capture_lane = 0;
  std::vector<std::size_t> capture_tail;  // the nodes its next node will depend on
  std::string name() const;
};

inline bool Mark::done() const { return !queue || queue->completed >= position; }

}  // namespace pptrain_emu::sched

namespace pptrain_emu {
// The runtime's handles: a stream owns its queue; an event remembers its last record.
struct Stream {
  std::shared_ptr<sched::Queue> queue;
};
struct Event {
  int device = 0;
  sched::Mark last;  // no queue until the first cudaEventRecord
  // The capture its last record was made in (that record is not a point of any queue)
  // and the nodes the record follows.
  std::shared_ptr<sched::Capture> captured;
  std::vector<std::size_t> captured_tail;
};
}  // namespace pptrain_emu

namespace pptrain_emu::sched {

// The lock every call below needs.
std::unique_lock<std::mutex> lock();

// A new registered queue on `device`, the legacy queue of a device (made on first use).
std::shared_ptr<Queue> new_queue(int device, bool blocking);
std::shared_ptr<Queue> legacy_queue(int device);
// The queue of a live stream handle (null: the current device's legacy stream), or null
// when the handle is not a live stream.
std::shared_ptr<Queue> queue_of(Stream* s);
bool live_stream(Stream* s);
void add_stream(Stream* s);
bool remove_stream(Stream* s);  // false when not live; its queue runs on until drained
bool live_event(Event* e);
void add_event(Event* e);
bool remove_event(Event* e);

// Queues an item, adding the legacy stream's implicit ordering, and returns the mark of
// its completion. With the "sync" schedule the item runs before submit returns.
Mark submit(std::unique_lock<std::mutex>& held, const std::shared_ptr<Queue>& q, std::string what,
            Work work, std::vector<Mark> after = {});
// Records a node of q's capture on q's lane after `deps`, makes it q's tail and returns
// its index.
std::size_t capture_node(Queue& q, std::string what, std::function<Work(std::uint64_t)> work_for,
                         std::vector<std::size_t> deps);
// The queue's handle is gone: it is dropped once its work has run.
void retire(const std::shared_ptr<Queue>& q);
// Whether a stream of `device` captures; a capturing queue's captures ends invalidated
// with `why` (a call capture does not allow was made).
bool capturing_on(int device);
void invalidate_captures(int device, const std::string& why);
void invalidate(Queue& q, const std::string& why);
// The capture ends: every stream in it stops capturing.
void end_capture(Capture& capture);
// The mark of q's last queued item.
Mark end_of(const std::shared_ptr<Queue>& q);
// The end of every queue of `device` (its pending work, destroyed streams' included).
std::vector<Mark> device_marks(int device);

// Runs queued work until every target is done. wait: blocks until then (polling while
// items wait for other processes); otherwise runs what can run now and says whether
// the targets are done. Throws what a work item throws, and on a dependency cycle.
// host_sees: once the targets are done the host has seen them complete (the race
// detector's host clock learns theirs); false for the "sync" schedule's running of work
// as it is queued, which orders nothing.
bool drive(std::unique_lock<std::mutex>& held, const std::vector<Mark>& targets, bool wait,
           bool host_sees = true);

}  // namespace pptrain_emu::sched
