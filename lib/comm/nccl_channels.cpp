// The pipeline's messages on channels: each (sender, receiver, channel) is a two-rank
// NCCL communicator with a stream of its own on both ranks. NCCL runs the operations of
// one communicator one after another, whatever the stream, so a send and a receive
// between the same ranks are independent only on different communicators. Here a send
// holds only its own channel until its receive is posted, and the compute stream waits
// for a receive only where it reads it (wait_in_queue) and for a send only where its
// buffer is reused.
//
// A transfer starts after the compute stream's earlier work (which produced what it
// sends and read what its receive overwrites): site "transfer-after-compute". The
// compute stream waits for it at site "compute-after-transfer".
#include <algorithm>
#include <utility>

#include "comm/nccl_impl.hpp"
#include "core/error.hpp"

namespace pptrain::comm::detail {
namespace {

// Several pending operations as one: each lane of a batch completes on its own.
class PendingAll final : public PendingOp {
 public:
  explicit PendingAll(std::vector<std::unique_ptr<PendingOp>> ops) : ops_(std::move(ops)) {}
  void wait() override {
    for (auto& op : ops_) op->wait();
  }
  bool test() override {
    return std::all_of(ops_.begin(), ops_.end(), [](const auto& op) { return op->test(); });
  }
  void wait_in_queue() override {
    for (auto& op : ops_) op->wait_in_queue();
  }

 private:
  std::vector<std::unique_ptr<PendingOp>> ops_;
};

class NcclChannelWorld final : public NcclWorldBase {
 public:
  NcclChannelWorld(std::shared_ptr<NcclContext> ctx, int size, std::vector<ChannelLane> lanes)
      : NcclWorldBase(std::move(ctx), size), lanes_(std::move(lanes)) {}

  std::unique_ptr<PendingOp> exchange_start(const std::vector<Transfer>& batch) override {
    std::vector<std::size_t> order(batch.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::vector<const ChannelLane*> used;  // in first use, one entry a lane
    std::vector<const ChannelLane*> lane_of;
    std::string group;  // the lanes' names, for the watchdog
    for (const Transfer& t : batch) {
      const ChannelLane& lane = find(t);
      lane_of.push_back(&lane);
      if (t.bytes > 0 && std::find(used.begin(), used.end(), &lane) == used.end()) {
        used.push_back(&lane);
        group += (group.empty() ? "" : "+") + lane.name;
      }
    }
    if (used.empty()) return std::make_unique<PendingAll>(std::vector<std::unique_ptr<PendingOp>>{});
    NcclOpInfo info{"exchange", group, awaited_transfers(batch, order)};
    cudaEvent_t ready = ctx_->record(ctx_->compute_stream(), info);
    for (const ChannelLane* lane : used)
      ctx_->stream_wait("transfer-after-compute", lane->stream, ready, info);
    ctx_->check(cudaEventDestroy(ready), "cudaEventDestroy", info);  // the waits are queued
    // A lane's transfers in the batch's order: the receiver issues its side in the same
    // order (the simulator checks that both sides agree, channel by channel).
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Transfer& t = batch[i];
      if (t.bytes == 0) continue;  // nothing to move; the peer skips its side too
      const ChannelLane& lane = *lane_of[i];
      cudaEvent_t begin = ctx_->begin_span(lane.stream, info);
      // The sender is rank 0 of the channel's communicator, the receiver rank 1.
      if (t.kind == Transfer::Send)
        ctx_->check(ncclSend(t.data, t.bytes, ncclUint8, 1, lane.comm, lane.stream), "ncclSend", info);
      else
        ctx_->check(ncclRecv(t.data, t.bytes, ncclUint8, 0, lane.comm, lane.stream), "ncclRecv", info);
      if (begin) ctx_->end_span(begin, lane.stream, lane.name, describe(t), info);
    }
    std::vector<std::unique_ptr<PendingOp>> pending;
    for (const ChannelLane* lane : used)
      pending.push_back(std::make_unique<NcclPending>(ctx_, lane->comm, ctx_->record(lane->stream, info),
                                                      info, "compute-after-transfer"));
    return std::make_unique<PendingAll>(std::move(pending));
  }

 private:
  const ChannelLane& find(const Transfer& t) const {
    PPTRAIN_CHECK(t.kind == Transfer::Send || t.kind == Transfer::Recv, "exchange: bad kind");
    PPTRAIN_CHECK(t.data != nullptr || t.bytes == 0, "exchange: null buffer");
    const bool send = t.kind == Transfer::Send;
    for (const ChannelLane& lane : lanes_)
      if (lane.peer == t.peer && lane.send == send && lane.channel == t.channel) return lane;
    throw std::logic_error("exchange: no pipeline channel " + std::to_string(t.channel) +
                           (send ? " to" : " from") + " world rank " + std::to_string(t.peer));
  }

  std::vector<ChannelLane> lanes_;
};

}  // namespace

std::unique_ptr<World> make_nccl_channel_world(std::shared_ptr<NcclContext> ctx, int size,
                                               std::vector<ChannelLane> lanes) {
  return std::make_unique<NcclChannelWorld>(std::move(ctx), size, std::move(lanes));
}

}  // namespace pptrain::comm::detail
