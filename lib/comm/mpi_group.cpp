// Collectives of one MPI communicator: each is started non-blocking and waited under
// the watchdog (mpi_wait.cpp), so a missing member ends the job with a message.
#include <cstddef>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <utility>

#include "comm/mpi_impl.hpp"
#include "comm/mpi_wait.hpp"
#include "core/error.hpp"

namespace pptrain::comm::detail {
namespace {

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

class MpiGroup final : public Group {
 public:
  MpiGroup(MpiShared shared, MPI_Comm comm, std::string name, std::vector<int> members)
      : shared_(std::move(shared)), comm_(comm), name_(std::move(name)),
        members_(std::move(members)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiGroup() override { MPI_Comm_free(&comm_); }

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return members_; }

  void all_reduce(float* data, std::size_t n, ReduceOp op) override {
    run("all_reduce", "MPI_Iallreduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(n, "all_reduce"), MPI_FLOAT,
                            mpi_op(op), comm_, r);
    });
  }
  void all_reduce(double* data, std::size_t n, ReduceOp op) override {
    run("all_reduce", "MPI_Iallreduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(n, "all_reduce"), MPI_DOUBLE,
                            mpi_op(op), comm_, r);
    });
  }
  void all_reduce(void* data, std::size_t n, DType dtype) override {
    if (dtype != DType::F32)
      throw std::runtime_error(name_ + ": MPI all_reduce takes fp32 arrays only, not " +
                               dtype_name(dtype));
    all_reduce(static_cast<float*>(data), n, ReduceOp::Sum);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                      DType dtype) override {
    if (dtype != DType::F32)
      throw std::runtime_error(name_ + ": MPI reduce_scatter takes fp32 arrays only, not " +
                               dtype_name(dtype));
    const void* in = send == recv ? MPI_IN_PLACE : send;
    run("reduce_scatter", "MPI_Ireduce_scatter_block", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in, recv, mpi_count(recv_count, "reduce_scatter"),
                                       MPI_FLOAT, MPI_SUM, comm_, r);
    });
  }
  // A gather moves bytes: any dtype, as MPI_BYTE when it is not fp32.
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype) override {
    const bool f32 = dtype == DType::F32;
    const std::size_t elems = f32 ? send_count : send_count * dtype_size(dtype);
    const MPI_Datatype type = f32 ? MPI_FLOAT : MPI_BYTE;
    const int count = mpi_count(elems, "all_gather");
    const void* mine = static_cast<const std::byte*>(recv) +
                       static_cast<std::size_t>(rank_) * send_count * dtype_size(dtype);
    const void* in = send == mine ? MPI_IN_PLACE : send;
    run("all_gather", "MPI_Iallgather", [&](MPI_Request* r) {
      return MPI_Iallgather(in, count, type, recv, count, type, comm_, r);
    });
  }
  void broadcast(float* data, std::size_t n, int root) override {
    PPTRAIN_CHECK(root >= 0 && root < size_, "broadcast on " + name_ + ": root " +
                                                 std::to_string(root) + " is not a member");
    run("broadcast", "MPI_Ibcast", [&](MPI_Request* r) {
      return MPI_Ibcast(data, mpi_count(n, "broadcast"), MPI_FLOAT, root, comm_, r);
    });
  }
  std::unique_ptr<PendingOp> all_reduce_start(float* data, std::size_t n) override {
    WaitInfo info = wait_info("all_reduce_start");
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(n, "all_reduce_start"),
                             MPI_FLOAT, MPI_SUM, comm_, requests.data()),
              "MPI_Iallreduce", info);
    return std::make_unique<MpiPending>(std::move(requests), std::move(info),
                                        timed(shared_.timeline, name_, span_name("all_reduce", n * 4)));
  }
  // MPI's in-place form leaves this rank's block at the front; it moves to its own place
  // once complete (the two ranges are disjoint for rank > 0).
  std::unique_ptr<PendingOp> reduce_scatter_start(float* data, std::size_t n) override {
    const std::size_t block = blocks_of(n, "reduce_scatter_start");
    WaitInfo info = wait_info("reduce_scatter_start");
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check_mpi(MPI_Ireduce_scatter_block(MPI_IN_PLACE, data, mpi_count(block, "reduce_scatter_start"),
                                        MPI_FLOAT, MPI_SUM, comm_, requests.data()),
              "MPI_Ireduce_scatter_block", info);
    std::function<void()> move;
    if (rank_ != 0)
      move = [data, block, r = std::size_t(rank_)] {
        std::memcpy(data + r * block, data, block * sizeof(float));
      };
    return std::make_unique<MpiPending>(
        std::move(requests), std::move(info),
        timed(shared_.timeline, name_, span_name("reduce_scatter", n * 4), std::move(move)));
  }
  std::unique_ptr<PendingOp> all_gather_start(void* data, std::size_t n, DType dtype) override {
    const bool f32 = dtype == DType::F32;
    const std::size_t elems = blocks_of(n, "all_gather_start") * (f32 ? 1 : dtype_size(dtype));
    const int block = mpi_count(elems, "all_gather_start");
    const MPI_Datatype type = f32 ? MPI_FLOAT : MPI_BYTE;
    WaitInfo info = wait_info("all_gather_start");
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check_mpi(MPI_Iallgather(MPI_IN_PLACE, block, type, data, block, type, comm_, requests.data()),
              "MPI_Iallgather", info);
    return std::make_unique<MpiPending>(
        std::move(requests), std::move(info),
        timed(shared_.timeline, name_, span_name("all_gather", n * dtype_size(dtype))));
  }

 private:
  WaitInfo wait_info(const char* op) const {
    return {op, name_, shared_.world_rank, shared_.timeout_s,
            [members = members_](const std::vector<std::size_t>&) {
              return Awaited{join_ranks(members), members};
            },
            shared_.liveness};
  }

  // Starts one non-blocking collective through `start` and waits for it.
  template <class Start>
  void run(const char* op, const char* call, Start&& start) {
    WaitInfo info = wait_info(op);
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check_mpi(start(requests.data()), call, info);
    wait_all(requests, info);
  }

  MpiShared shared_;  // keeps MPI alive until comm_ is freed
  MPI_Comm comm_;
  std::string name_;
  std::vector<int> members_;
  int rank_ = 0, size_ = 0;
};

}  // namespace

std::unique_ptr<Group> make_mpi_group(MpiShared shared, MPI_Comm comm, std::string name,
                                      std::vector<int> members) {
  return std::make_unique<MpiGroup>(std::move(shared), comm, std::move(name), std::move(members));
}

}  // namespace pptrain::comm::detail
