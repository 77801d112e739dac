// Point-to-point by world rank over an NCCL communicator of every rank: a batch of
// sends and receives is one NCCL group (ncclGroupStart/End) on the compute stream, so
// neighbours exchanging both ways cannot deadlock inside a batch. exchange() returns at
// once: the compute stream orders the batch before later work, and the context's
// watchdog watches it; the wait() of exchange_start blocks under the watchdog. Barriers
// and aborts go through the host world.
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

class NcclWorld final : public World {
 public:
  NcclWorld(std::shared_ptr<NcclContext> ctx, ncclComm_t comm, int size)
      : ctx_(std::move(ctx)), comm_(comm), size_(size) {}

  int rank() const override { return ctx_->world_rank(); }
  int size() const override { return size_; }

  void exchange(const std::vector<Transfer>& batch) override {
    exchange_start(batch)->wait_in_queue();
  }

  void check_progress() override { ctx_->check_progress(); }

  std::unique_ptr<PendingOp> exchange_start(const std::vector<Transfer>& batch) override {
    for (const Transfer& t : batch) check_transfer(t);
    std::vector<std::size_t> order(batch.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    NcclOpInfo info{"exchange", "world", awaited_transfers(batch, order)};
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return batch[a].tag < batch[b].tag;
    });
    const cudaStream_t stream = ctx_->compute_stream();
    ctx_->check(ncclGroupStart(), "ncclGroupStart", info);
    for (std::size_t i : order) {
      const Transfer& t = batch[i];
      if (t.bytes == 0) continue;  // nothing to move; the peer skips its side too
      if (t.kind == Transfer::Send)
        ctx_->check(ncclSend(t.data, t.bytes, ncclUint8, t.peer, comm_, stream), "ncclSend", info);
      else
        ctx_->check(ncclRecv(t.data, t.bytes, ncclUint8, t.peer, comm_, stream), "ncclRecv", info);
    }
    ctx_->check(ncclGroupEnd(), "ncclGroupEnd", info);
    cudaEvent_t done = ctx_->record(stream, info);
    return std::make_unique<NcclPending>(ctx_, comm_, done, std::move(info));
  }

  void barrier() override { ctx_->host_world().barrier(); }

  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    ctx_->abort(message, exit_code);
  }

 private:
  void check_transfer(const Transfer& t) const {
    PPTRAIN_CHECK(t.kind == Transfer::Send || t.kind == Transfer::Recv, "exchange: bad kind");
    PPTRAIN_CHECK(t.peer >= 0 && t.peer < size_,
                  "exchange: peer " + std::to_string(t.peer) + " is not a world rank");
    PPTRAIN_CHECK(t.tag >= 0, "exchange: tag " + std::to_string(t.tag) + " is negative");
    PPTRAIN_CHECK(t.data != nullptr || t.bytes == 0, "exchange: null buffer");
  }

  std::shared_ptr<NcclContext> ctx_;
  ncclComm_t comm_;  // owned by ctx_
  int size_;
};

}  // namespace

std::unique_ptr<World> make_nccl_world(std::shared_ptr<NcclContext> ctx, ncclComm_t comm,
                                       int size) {
  return std::make_unique<NcclWorld>(std::move(ctx), comm, size);
}

}  // namespace pptrain::comm::detail
