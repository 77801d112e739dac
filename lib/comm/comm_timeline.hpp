// What the communication running beside compute did during a traced step, as spans on
// tracks of their own (logging.trace): the data-parallel buckets' collectives, the
// pipeline's messages left to complete in the background, the context-parallel ring's
// exchanges. Host operations (MPI) are timed on the host, from their start to the first
// time the host saw them complete; device operations (NCCL) by CUDA events on their own
// streams, placed on the host clock from the step's start.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace pptrain::comm {

struct CommSpan {
  using Clock = std::chrono::steady_clock;
  std::string track;  // the group or stream: "dp(tp=0,cp=0,pp=0)", "pipeline-channel-0(0->1)"
  std::string name;   // the operation: "all_reduce_start", "send to 1 tag 3", ...
  Clock::time_point begin, end;
};

// Spans measured on a device, relative to a reference recorded on its compute stream.
class DeviceSpanSource {
 public:
  virtual ~DeviceSpanSource() = default;
  // Spans are recorded from now on when `on`; the compute stream's position now is
  // their time zero.
  virtual void start(bool on) = 0;
  // The spans since start(), time zero placed at `origin`; only after the host has
  // waited for the step. Spans whose events have not completed are left out.
  virtual std::vector<CommSpan> take(CommSpan::Clock::time_point origin) = 0;
};

// One per Comms. Not thread-safe: the thread that runs the step uses it.
class CommTimeline {
 public:
  using Clock = CommSpan::Clock;
  bool on() const { return on_; }
  // Starts a step: spans are kept from here until take() when `on`.
  void start_step(bool on) {
    on_ = on;
    host_.clear();
    if (auto device = device_.lock()) device->start(on);
  }
  // A host operation's span; dropped unless on.
  void add(CommSpan span) {
    if (on_) host_.push_back(std::move(span));
  }
  // Ends the step: its spans, device time zero at `origin` (the step's start).
  std::vector<CommSpan> take(Clock::time_point origin) {
    std::vector<CommSpan> out = std::move(host_);
    host_.clear();
    if (auto device = device_.lock())
      for (CommSpan& s : device->take(origin)) out.push_back(std::move(s));
    on_ = false;
    return out;
  }
  // The device communicators' spans (add_nccl_comms); they may go first.
  void set_device(std::weak_ptr<DeviceSpanSource> device) { device_ = std::move(device); }

 private:
  bool on_ = false;
  std::vector<CommSpan> host_;
  std::weak_ptr<DeviceSpanSource> device_;
};

}  // namespace pptrain::comm
