// Point-to-point by world rank over an NCCL communicator: a batch of sends and receives
// is one NCCL group (ncclGroupStart/End), so neighbours exchanging both ways cannot
// deadlock inside a batch. The world's communicator holds every rank and runs on the
// compute stream; a ring's holds its cp group and runs on a stream of its own, after
// the compute stream's earlier work (which produced what it sends and read what its
// receives overwrite). exchange() returns at once: the compute stream waits for the
// batch before later work, and the context's watchdog watches it; the wait() of
// exchange_start blocks under the watchdog. Barriers and aborts go through the host
// world.
//
// NCCL matches a peer's sends with this rank's receives in the order they are issued,
// not by tag. Within a batch the transfers are issued in tag order, so two batches that
// hold the same tags match by tag; across batches, the messages between two ranks
// must be started in the same order on both sides. A send that is not in the same
// batch as the receive its peer is waiting on may block (NCCL sends wait for their
// receive), so ranks that both send first and receive later must batch the two.
#include <algorithm>
#include <numeric>
#include <utility>

#include "comm/nccl_impl.hpp"
#include "core/error.hpp"

namespace pptrain::comm::detail {
namespace {

class NcclWorld final : public NcclWorldBase {
 public:
  NcclWorld(std::shared_ptr<NcclContext> ctx, ncclComm_t comm, int size, std::vector<int> members,
            cudaStream_t own_stream)
      : NcclWorldBase(std::move(ctx), size), comm_(comm), members_(std::move(members)),
        own_stream_(own_stream) {}

  std::unique_ptr<PendingOp> exchange_start(const std::vector<Transfer>& batch) override {
    for (const Transfer& t : batch) check_transfer(t);
    std::vector<std::size_t> order(batch.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    NcclOpInfo info{"exchange", "world", awaited_transfers(batch, order)};
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return batch[a].tag < batch[b].tag;
    });
    const cudaStream_t stream = own_stream_ ? own_stream_ : ctx_->compute_stream();
    if (own_stream_) {
      cudaEvent_t ready = ctx_->record(ctx_->compute_stream(), info);
      ctx_->stream_wait("exchange-after-compute", own_stream_, ready, info);
      ctx_->check(cudaEventDestroy(ready), "cudaEventDestroy", info);  // the wait is queued
    }
    cudaEvent_t begin = own_stream_ ? ctx_->begin_span(stream, info) : nullptr;
    ctx_->check(ncclGroupStart(), "ncclGroupStart", info);
    for (std::size_t i : order) {
      const Transfer& t = batch[i];
      if (t.bytes == 0) continue;  // nothing to move; the peer skips its side too
      const int peer = comm_rank(t.peer);
      if (t.kind == Transfer::Send)
        ctx_->check(ncclSend(t.data, t.bytes, ncclUint8, peer, comm_, stream), "ncclSend", info);
      else
        ctx_->check(ncclRecv(t.data, t.bytes, ncclUint8, peer, comm_, stream), "ncclRecv", info);
    }
    ctx_->check(ncclGroupEnd(), "ncclGroupEnd", info);
    if (begin) ctx_->end_span(begin, stream, "cp ring", "exchange", info);
    cudaEvent_t done = ctx_->record(stream, info);
    return std::make_unique<NcclPending>(
        ctx_, comm_, done, std::move(info),
        own_stream_ ? "compute-after-exchange" : "compute-after-collective");
  }

 private:
  void check_transfer(const Transfer& t) const {
    PPTRAIN_CHECK(t.kind == Transfer::Send || t.kind == Transfer::Recv, "exchange: bad kind");
    PPTRAIN_CHECK(t.peer >= 0 && t.peer < size_,
                  "exchange: peer " + std::to_string(t.peer) + " is not a world rank");
    PPTRAIN_CHECK(comm_rank(t.peer) < int(members_.size()),
                  "exchange: world rank " + std::to_string(t.peer) +
                      " is not in this communicator");
    PPTRAIN_CHECK(t.tag >= 0, "exchange: tag " + std::to_string(t.tag) + " is negative");
    PPTRAIN_CHECK(t.data != nullptr || t.bytes == 0, "exchange: null buffer");
  }

  // The communicator rank of a world rank; members_.size() when it is not a member.
  int comm_rank(int world_rank) const {
    return int(std::find(members_.begin(), members_.end(), world_rank) - members_.begin());
  }

  ncclComm_t comm_;  // owned by ctx_
  std::vector<int> members_;  // world rank by communicator rank
  cudaStream_t own_stream_;   // null: the compute stream
};

}  // namespace

std::unique_ptr<World> make_nccl_world(std::shared_ptr<NcclContext> ctx, ncclComm_t comm,
                                       int size, std::vector<int> members,
                                       cudaStream_t own_stream) {
  return std::make_unique<NcclWorld>(std::move(ctx), comm, size, std::move(members), own_stream);
}

}  // namespace pptrain::comm::detail
