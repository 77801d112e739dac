// The emulated NCCL's groups and work items. ncclGroupStart/End nest; what is issued
// inside is queued at the outermost ncclGroupEnd as one work item on each stream it uses,
// all items running one operation: as NCCL documents for a group on several streams, it
// starts once every one of those streams has reached it and each stream waits until it
// completes. Its operations are posted together and then progress together; outside a
// group each call is its own item. An operation of an aborted or destroyed communicator
// finishes at once, without touching memory. On streams that capture a graph the group
// (or call) is recorded instead, and each launch of the graph makes its operations again,
// in the order they were issued, and runs them as such a batch.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "emulator_nccl.hpp"
#include "emulator_streams.hpp"

namespace pptrain_emu::nccl_emu {

namespace {

// The operations of one group (or one call), run by an item on each of its streams
// (enqueue_together). Each operation's memory is noted by the item of the stream it was
// issued on, for the race detector.
class Batch {
 public:
  // ops[i] was issued on stream number stream_of[i].
  Batch(std::vector<std::unique_ptr<Op>> ops, std::vector<std::size_t> stream_of,
        std::size_t streams)
      : ops_(std::move(ops)), stream_of_(std::move(stream_of)), done_(ops_.size()),
        arrived_(streams), noted_(streams) {
    for (auto& op : ops_) ++op->comm().queued;
  }
  ~Batch() {
    for (std::size_t i = 0; i < ops_.size(); ++i)
      if (!done_[i]) --ops_[i]->comm().queued;
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  const std::string& first_what() const { return ops_.front()->what(); }
  // Every stream's earlier work is done (streams that run each item as it is queued).
  void all_arrived() { arrived_.assign(arrived_.size(), true); }

  // The item of stream `index`: true once every operation has finished.
  bool run(std::size_t index) {
    if (!noted_[index]) {  // its stream's item touches the memory of its operations
      noted_[index] = true;
      for (std::size_t i = 0; i < ops_.size(); ++i)
        if (stream_of_[i] == index) ops_[i]->note_touches();
    }
    arrived_[index] = true;
    if (std::find(arrived_.begin(), arrived_.end(), false) != arrived_.end()) return false;
    if (!posted_) {
      posted_ = true;
      for (auto& op : ops_)
        if (!gone(op->comm())) op->post();
    }
    bool all = true;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      if (done_[i]) continue;
      Op& op = *ops_[i];
      if (gone(op.comm())) {
        op.abandon();  // finishes as failed: no memory is touched
      } else if (!op.test()) {
        all = false;
        continue;
      }
      done_[i] = true;
      --op.comm().queued;
    }
    return all;
  }

 private:
  static bool gone(const Comm& c) { return c.aborted || c.destroyed; }
  std::vector<std::unique_ptr<Op>> ops_;
  std::vector<std::size_t> stream_of_;
  std::vector<bool> done_, arrived_, noted_;
  bool posted_ = false;
};

struct Issued {
  cudaStream_t stream;
  OpMaker make;
};
struct GroupState {
  int depth = 0;
  ncclResult_t error = ncclSuccess;
  std::string error_text;
  std::vector<Issued> issued;
};
GroupState& group() {
  static GroupState g;
  return g;
}

// The streams of `on` in order of first use.
std::vector<cudaStream_t> distinct(const std::vector<cudaStream_t>& on) {
  std::vector<cudaStream_t> streams;
  for (cudaStream_t s : on)
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  return streams;
}

// The batch of the operations made by `makers`, each issued on the stream of the same
// index of `on`.
std::shared_ptr<Batch> make_batch(const std::vector<cudaStream_t>& on,
                                  const std::vector<OpMaker>& makers) {
  const std::vector<cudaStream_t> streams = distinct(on);
  std::vector<std::size_t> stream_of;
  for (cudaStream_t s : on)
    stream_of.push_back(std::size_t(std::find(streams.begin(), streams.end(), s) - streams.begin()));
  std::vector<std::unique_ptr<Op>> ops;
  for (const OpMaker& make : makers) ops.push_back(make());
  auto batch = std::make_shared<Batch>(std::move(ops), std::move(stream_of), streams.size());
  if (stream_schedule() == "sync") batch->all_arrived();
  return batch;
}

std::string describe(std::size_t ops, std::size_t streams, const std::string& first) {
  if (ops == 1) return first;
  return "NCCL group of " + std::to_string(ops) + " operations (" + first + ", ...)" +
         (streams > 1 ? " on " + std::to_string(streams) + " streams" : "");
}

bool captures(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

// Queues the operations, each issued on the stream of the same index, as one batch. On
// streams that capture a graph they are recorded instead, and each launch makes them
// again (the first of the batch's nodes that a launch reaches makes the batch).
ncclResult_t queue(const std::vector<cudaStream_t>& on, std::vector<OpMaker> makers) {
  const std::vector<cudaStream_t> streams = distinct(on);
  const auto capturing = std::size_t(std::count_if(streams.begin(), streams.end(), captures));
  if (capturing == 0) {
    const auto batch = make_batch(on, makers);
    enqueue_together(streams, describe(makers.size(), streams.size(), batch->first_what()),
                     [&batch](std::size_t k) -> Work { return [batch, k] { return batch->run(k); }; });
    return ncclSuccess;
  }
  struct PerLaunch {
    std::uint64_t launch = 0;  // launches count from 1
    std::shared_ptr<Batch> batch;
  };
  auto made = std::make_shared<PerLaunch>();
  auto recipe_of = [on, makers, made](std::size_t k) -> WorkRecipe {
    return [on, makers, made, k](std::uint64_t launch) -> Work {
      if (made->launch != launch) *made = {launch, make_batch(on, makers)};
      return [batch = made->batch, k] { return batch->run(k); };
    };
  };
  const std::string what = describe(makers.size(), streams.size(), "a captured NCCL operation");
  if (capturing != streams.size() || !capture_together(streams, what, recipe_of))
    return fail(ncclInvalidUsage, "NCCL operations on streams of which some capture a graph "
                                  "and some do not, or that capture different graphs");
  return ncclSuccess;
}

}  // namespace

ncclResult_t submit(cudaStream_t stream, OpMaker make) {
  if (group().depth > 0) {
    group().issued.push_back({stream, std::move(make)});
    return ncclSuccess;
  }
  return queue({stream}, {std::move(make)});
}

// A failed call inside a group fails the group too.
ncclResult_t refuse(ncclResult_t rc, const std::string& text) {
  if (group().depth > 0 && group().error == ncclSuccess) {
    group().error = rc;
    group().error_text = text;
  }
  return fail(rc, text);
}

}  // namespace pptrain_emu::nccl_emu

namespace pptrain_emu::nccl {

using namespace pptrain_emu::nccl_emu;  // NOLINT

ncclResult_t ncclGroupStart() {
  ++group().depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  GroupState& g = group();
  if (g.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart is open");
  if (--g.depth > 0) return ncclSuccess;
  std::vector<Issued> issued = std::move(g.issued);
  g.issued.clear();
  if (g.error != ncclSuccess) {  // nothing of a failed group is queued
    const ncclResult_t rc = g.error;
    g.error = ncclSuccess;
    return fail(rc, "ncclGroupEnd: a call in the group failed: " + g.error_text);
  }
  if (issued.empty()) return ncclSuccess;
  std::vector<cudaStream_t> streams;
  std::vector<OpMaker> makers;
  for (Issued& i : issued) {
    streams.push_back(i.stream);
    makers.push_back(std::move(i.make));
  }
  if (const ncclResult_t rc = queue(streams, std::move(makers)); rc != ncclSuccess)
    return fail(rc, std::string("ncclGroupEnd: ") + last_error_text());
  return ncclSuccess;
}

}  // namespace pptrain_emu::nccl
