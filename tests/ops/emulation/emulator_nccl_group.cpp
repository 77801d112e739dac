// The emulated NCCL's groups and work items. ncclGroupStart/End nest; what is issued
// inside is queued at the outermost ncclGroupEnd as one work item on each stream it uses,
// all items running one operation: as NCCL documents for a group on several streams, it
// starts once every one of those streams has reached it and each stream waits until it
// completes. Its operations are posted together and then progress together; outside a
// group each call is its own item. An operation of an aborted or destroyed communicator
// finishes at once, without touching memory.
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
  std::unique_ptr<Op> op;
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

// Queues the operations, each issued on the stream of the same index, as one batch.
void queue(const std::vector<cudaStream_t>& on, std::vector<std::unique_ptr<Op>> ops) {
  std::vector<cudaStream_t> streams;  // in order of first use
  std::vector<std::size_t> stream_of;
  for (cudaStream_t s : on) {
    auto it = std::find(streams.begin(), streams.end(), s);
    if (it == streams.end()) it = streams.insert(it, s);
    stream_of.push_back(std::size_t(it - streams.begin()));
  }
  std::string what = ops[0]->what();
  if (ops.size() > 1)
    what = "NCCL group of " + std::to_string(ops.size()) + " operations (" + what + ", ...)" +
           (streams.size() > 1 ? " on " + std::to_string(streams.size()) + " streams" : "");
  auto batch = std::make_shared<Batch>(std::move(ops), std::move(stream_of), streams.size());
  if (stream_schedule() == "sync") batch->all_arrived();
  enqueue_together(streams, what, [&batch](std::size_t k) -> Work {
    return [batch, k] { return batch->run(k); };
  });
}

// NCCL operations in a captured graph are not modelled: each is a one-time exchange with
// its peers (emulator_nccl_core.cpp), which a replay would not repeat.
bool captures(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
}
const char* const kCaptured = "an NCCL operation on a capturing stream (the emulator does not "
                              "replay NCCL operations in graphs)";

}  // namespace

ncclResult_t submit(cudaStream_t stream, std::unique_ptr<Op> op) {
  if (captures(stream)) return refuse(ncclInvalidUsage, kCaptured);
  if (group().depth > 0) {
    group().issued.push_back({stream, std::move(op)});
    return ncclSuccess;
  }
  std::vector<std::unique_ptr<Op>> ops;
  ops.push_back(std::move(op));
  queue({stream}, std::move(ops));
  return ncclSuccess;
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
  std::vector<std::unique_ptr<Op>> ops;
  for (const Issued& i : issued)
    if (captures(i.stream)) return fail(ncclInvalidUsage, std::string("ncclGroupEnd: ") + kCaptured);
  for (Issued& i : issued) {
    streams.push_back(i.stream);
    ops.push_back(std::move(i.op));
  }
  queue(streams, std::move(ops));
  return ncclSuccess;
}

}  // namespace pptrain_emu::nccl
