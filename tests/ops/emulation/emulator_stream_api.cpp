// The emulated runtime's stream and event calls (emulator_host_api.hpp) over the queues
// of emulator_streams.cpp: creation and destruction as CUDA defines them (a destroyed
// stream's queued work still runs; an event's records and the waits on them outlive it),
// records and waits as queue items, and the synchronisations and queries that make work
// due. Handles are checked on every use.
#include <algorithm>
#include <string>

#include "cuda_emulator.hpp"
#include "emulator_schedule.hpp"

namespace pptrain_emu {

namespace {
bool done_at_once() { return true; }
}  // namespace

cudaError_t stream_create(Stream** s, unsigned flags) {
  if (s == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return cudaErrorInvalidValue;
  auto held = sched::lock();
  *s = new Stream{sched::new_queue(current_device(), (flags & cudaStreamNonBlocking) == 0)};
  sched::add_stream(*s);
  return cudaSuccess;
}

cudaError_t stream_check(Stream* s) {
  auto held = sched::lock();
  return s == nullptr || sched::live_stream(s) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t launch_stream_check(Stream* s) {
  auto held = sched::lock();
  if (s == nullptr) return cudaSuccess;
  return sched::live_stream(s) && s->queue->device == current_device()
             ? cudaSuccess
             : cudaErrorInvalidResourceHandle;
}

cudaError_t stream_destroy(Stream* s) {
  {
    auto held = sched::lock();
    if (!sched::remove_stream(s)) return cudaErrorInvalidResourceHandle;
  }
  delete s;  // the queue lives on in the scheduler until its work has run
  return cudaSuccess;
}

cudaError_t stream_synchronize(Stream* s) {
  auto held = sched::lock();
  const auto q = sched::queue_of(s);
  if (!q) return cudaErrorInvalidResourceHandle;
  if (q->capture) {
    sched::invalidate(*q, "cudaStreamSynchronize");
    return cudaErrorStreamCaptureUnsupported;
  }
  sched::drive(held, {sched::end_of(q)}, true);
  return cudaSuccess;
}

cudaError_t stream_query(Stream* s) {
  auto held = sched::lock();
  const auto q = sched::queue_of(s);
  if (!q) return cudaErrorInvalidResourceHandle;
  if (q->capture) {
    sched::invalidate(*q, "cudaStreamQuery");
    return cudaErrorStreamCaptureUnsupported;
  }
  return sched::drive(held, {sched::end_of(q)}, false) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t stream_wait_event(Stream* s, Event* e) {
  auto held = sched::lock();
  const auto q = sched::queue_of(s);
  if (!q || !sched::live_event(e)) return cudaErrorInvalidResourceHandle;
  // Inside a capture a wait for a record of the same capture adds that record's nodes to
  // what the stream's next node depends on; a stream outside any capture joins the
  // capture so (a lane of its own). A wait for work outside the capture, or of another,
  // isolates nothing: it fails.
  if (q->capture) {
    if (e->captured == q->capture) {
      for (std::size_t n : e->captured_tail)
        if (std::find(q->capture_tail.begin(), q->capture_tail.end(), n) == q->capture_tail.end())
          q->capture_tail.push_back(n);
      return cudaSuccess;
    }
    sched::invalidate(*q, "cudaStreamWaitEvent for work outside the capture");
    return e->captured ? cudaErrorStreamCaptureMerge : cudaErrorStreamCaptureIsolation;
  }
  if (e->captured) {
    if (e->captured->ended || q->legacy || q->device != e->device)
      return cudaErrorStreamCaptureUnsupported;
    q->capture = e->captured;
    q->capture_lane = e->captured->lanes++;
    q->capture_tail = e->captured_tail;
    return cudaSuccess;
  }
  // The wait is for the record made last before this call; none: nothing to wait for.
  const sched::Mark record = e->last;
  std::string what = "cudaStreamWaitEvent for ";
  what += record.queue ? "item " + std::to_string(record.position) + " of " + record.queue->name()
                       : "an event never recorded";
  std::vector<sched::Mark> after;
  if (record.queue) after.push_back(record);
  sched::submit(held, q, std::move(what), done_at_once, std::move(after));
  return cudaSuccess;
}

void synchronize_device(int device) {
  auto held = sched::lock();
  sched::drive(held, sched::device_marks(device), true);
}

cudaError_t device_synchronize() {
  {
    auto held = sched::lock();
    if (sched::capturing_on(current_device())) {
      sched::invalidate_captures(current_device(), "cudaDeviceSynchronize");
      return cudaErrorStreamCaptureUnsupported;
    }
  }
  synchronize_device(current_device());
  return cudaSuccess;
}

cudaError_t event_create(Event** e) {
  if (e == nullptr) return cudaErrorInvalidValue;
  auto held = sched::lock();
  *e = new Event{current_device(), {}, nullptr, {}};
  sched::add_event(*e);
  return cudaSuccess;
}

cudaError_t event_check(Event* e) {
  auto held = sched::lock();
  return sched::live_event(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t event_destroy(Event* e) {
  {
    auto held = sched::lock();
    if (!sched::remove_event(e)) return cudaErrorInvalidResourceHandle;
  }
  delete e;  // queued waits hold their own copy of the record
  return cudaSuccess;
}

cudaError_t event_record(Event* e, Stream* s) {
  auto held = sched::lock();
  const auto q = sched::queue_of(s);
  if (!q || !sched::live_event(e) || q->device != e->device)
    return cudaErrorInvalidResourceHandle;
  if (q->capture) {  // a point of the graph, not of any queue
    e->captured = q->capture;
    e->captured_tail = q->capture_tail;
    e->last = {};
    return cudaSuccess;
  }
  e->captured = nullptr;
  e->captured_tail.clear();
  e->last = sched::submit(held, q, "cudaEventRecord", done_at_once);
  return cudaSuccess;
}

cudaError_t event_query(Event* e) {
  auto held = sched::lock();
  if (!sched::live_event(e)) return cudaErrorInvalidResourceHandle;
  if (e->captured) return cudaErrorCapturedEvent;
  return sched::drive(held, {e->last}, false) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t event_synchronize(Event* e) {
  auto held = sched::lock();
  if (!sched::live_event(e)) return cudaErrorInvalidResourceHandle;
  if (e->captured) return cudaErrorCapturedEvent;
  sched::drive(held, {e->last}, true);
  return cudaSuccess;
}

}  // namespace pptrain_emu
