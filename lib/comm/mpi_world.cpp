// Point-to-point by world rank over a private duplicate of MPI_COMM_WORLD: a batch of
// sends and receives is started together and waited under the watchdog.
#include <utility>

#include "comm/mpi_impl.hpp"
#include "comm/mpi_wait.hpp"
#include "core/error.hpp"

namespace pptrain::comm::detail {
namespace {

class MpiWorld final : public World {
 public:
  MpiWorld(MpiShared shared, MPI_Comm comm) : shared_(std::move(shared)), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found);
    tag_ub_ = found && ub ? *ub : 32767;
  }
  ~MpiWorld() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void exchange(const std::vector<Transfer>& batch) override { exchange_start(batch)->wait(); }

  std::unique_ptr<PendingOp> exchange_start(const std::vector<Transfer>& batch) override {
    WaitInfo info{"exchange", "world", rank_, shared_.timeout_s,
                  [batch](const std::vector<std::size_t>& pending) {
                    return awaited_transfers(batch, pending);
                  },
                  shared_.liveness};
    std::vector<MPI_Request> requests(batch.size(), MPI_REQUEST_NULL);
    for (std::size_t i = 0; i < batch.size(); ++i) check_transfer(batch[i]);
    // Receives first, so that a peer's sends find them posted.
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const Transfer& t = batch[i];
        const int count = static_cast<int>(t.bytes);
        if (pass == 0 && t.kind == Transfer::Recv)
          check_mpi(MPI_Irecv(t.data, count, MPI_BYTE, t.peer, t.tag, comm_, &requests[i]),
                    "MPI_Irecv", info);
        if (pass == 1 && t.kind == Transfer::Send)
          check_mpi(MPI_Isend(t.data, count, MPI_BYTE, t.peer, t.tag, comm_, &requests[i]),
                    "MPI_Isend", info);
      }
    }
    std::string what;  // for the trace, only while it records
    if (shared_.timeline->on())
      for (const Transfer& t : batch) what += (what.empty() ? "" : ", ") + describe(t);
    return std::make_unique<MpiPending>(std::move(requests), std::move(info),
                                        timed(shared_.timeline, "messages", what));
  }

  void barrier() override {
    WaitInfo info{"barrier", "world", rank_, shared_.timeout_s,
                  [size = size_](const std::vector<std::size_t>&) {
                    return Awaited{"all", every_rank(size)};
                  },
                  shared_.liveness};
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check_mpi(MPI_Ibarrier(comm_, requests.data()), "MPI_Ibarrier", info);
    wait_all(requests, info);
  }

  std::optional<std::vector<int>> silent_peers(const std::vector<int>& peers) override {
    if (!shared_.liveness) return std::nullopt;
    return shared_.liveness->silent(peers);
  }
  void answer_peers() override {
    if (shared_.liveness) shared_.liveness->answer();
  }

  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    abort_job(rank_, message, exit_code);
  }

 private:
  void check_transfer(const Transfer& t) const {
    PPTRAIN_CHECK(t.kind == Transfer::Send || t.kind == Transfer::Recv, "exchange: bad kind");
    PPTRAIN_CHECK(t.peer >= 0 && t.peer < size_,
                  "exchange: peer " + std::to_string(t.peer) + " is not a world rank");
    PPTRAIN_CHECK(t.tag >= 0 && t.tag <= tag_ub_,
                  "exchange: tag " + std::to_string(t.tag) + " is outside [0, " +
                      std::to_string(tag_ub_) + "]");
    PPTRAIN_CHECK(t.data != nullptr || t.bytes == 0, "exchange: null buffer");
    mpi_count(t.bytes, "exchange");
  }

  MpiShared shared_;  // keeps MPI alive until comm_ is freed
  MPI_Comm comm_;
  int rank_ = 0, size_ = 0, tag_ub_ = 32767;
};

}  // namespace

std::unique_ptr<World> make_mpi_world(MpiShared shared, MPI_Comm comm) {
  return std::make_unique<MpiWorld>(std::move(shared), comm);
}

}  // namespace pptrain::comm::detail
