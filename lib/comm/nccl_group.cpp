// Collectives of one NCCL communicator on arrays in GPU memory. Each is queued on the
// compute stream, after the work already there and before the work queued later; the
// host does not wait. The *_start collectives run on the context's own stream instead,
// so gradient reduction overlaps the backward pass, and the *_beside ones on the group's
// own stream (the tensor-parallel group's: its input gradients travel while the weight
// gradients are computed, the norms' outputs while the input gradients are, and the
// forward's gathers and sums block by block beside the GEMMs' other blocks); their
// wait() is watched, and their wait_in_queue() leaves the host free.
#include <algorithm>
#include <cstddef>
#include <utility>

#include "comm/mpi_wait.hpp"
#include "comm/nccl_impl.hpp"
#include "core/error.hpp"

namespace pptrain::comm::detail {
namespace {

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }
ncclDataType_t nccl_type(DType dtype) { return dtype == DType::F32 ? ncclFloat32 : ncclBfloat16; }

class NcclGroup final : public Group {
 public:
  NcclGroup(std::shared_ptr<NcclContext> ctx, ncclComm_t comm, std::string name,
            std::vector<int> members, cudaStream_t beside)
      : ctx_(std::move(ctx)), comm_(comm), name_(std::move(name)), members_(std::move(members)),
        beside_(beside ? beside : ctx_->comm_stream()) {
    const auto it = std::find(members_.begin(), members_.end(), ctx_->world_rank());
    PPTRAIN_CHECK(it != members_.end(), name_ + ": rank is not in its own group");
    rank_ = static_cast<int>(it - members_.begin());
    peers_ = {join_ranks(members_), members_};
  }

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& world_ranks() const override { return members_; }

  void all_reduce(float* data, std::size_t n, ReduceOp op) override {
    if (n == 0) return;
    ctx_->check(ncclAllReduce(data, data, n, ncclFloat32, nccl_op(op), comm_, stream()),
                "ncclAllReduce", info("all_reduce"));
  }
  void all_reduce(double* data, std::size_t n, ReduceOp op) override {
    if (n == 0) return;
    ctx_->check(ncclAllReduce(data, data, n, ncclFloat64, nccl_op(op), comm_, stream()),
                "ncclAllReduce", info("all_reduce"));
  }
  void all_reduce(void* data, std::size_t n, DType dtype) override {
    if (n == 0) return;
    ctx_->check(ncclAllReduce(data, data, n, nccl_type(dtype), ncclSum, comm_, stream()), "ncclAllReduce",
                info("all_reduce"));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                      DType dtype) override {
    if (recv_count == 0) return;
    const ncclDataType_t type = nccl_type(dtype);
    if (send != recv) {
      ctx_->check(ncclReduceScatter(send, recv, recv_count, type, ncclSum, comm_, stream()),
                  "ncclReduceScatter", info("reduce_scatter"));
      return;
    }
    // In place, as MPI: the input is recv and the result goes to its front. NCCL's
    // in-place form leaves this rank's block at its own offset, so it moves afterwards
    // (the two ranges are disjoint for rank > 0).
    const std::size_t bytes = recv_count * dtype_size(dtype);
    void* mine = static_cast<std::byte*>(recv) + static_cast<std::size_t>(rank_) * bytes;
    ctx_->check(ncclReduceScatter(recv, mine, recv_count, type, ncclSum, comm_, stream()),
                "ncclReduceScatter", info("reduce_scatter"));
    if (rank_ != 0)
      ctx_->check(cudaMemcpyAsync(recv, mine, bytes, cudaMemcpyDeviceToDevice, stream()),
                  "cudaMemcpyAsync", info("reduce_scatter"));
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype) override {
    if (send_count == 0) return;
    // send == this rank's block of recv is NCCL's in-place form too.
    ctx_->check(ncclAllGather(send, recv, send_count, nccl_type(dtype), comm_, stream()),
                "ncclAllGather", info("all_gather"));
  }
  void broadcast(float* data, std::size_t n, int root) override {
    check_root(root, "broadcast");
    if (n == 0) return;
    ctx_->check(ncclBroadcast(data, data, n, ncclFloat32, root, comm_, stream()),
                "ncclBroadcast", info("broadcast"));
  }
  std::unique_ptr<PendingOp> all_reduce_start(float* data, std::size_t n) override {
    return start_on_side("all_reduce_start", [&](cudaStream_t side) {
      return ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, side);
    }, n);
  }
  // NCCL's in-place forms: this rank's block is at its own offset of the whole array.
  std::unique_ptr<PendingOp> reduce_scatter_start(float* data, std::size_t n) override {
    const std::size_t block = blocks_of(n, "reduce_scatter_start");
    float* mine = data + std::size_t(rank_) * block;
    return start_on_side("reduce_scatter_start", [&](cudaStream_t side) {
      return ncclReduceScatter(data, mine, block, ncclFloat32, ncclSum, comm_, side);
    }, n);
  }
  std::unique_ptr<PendingOp> all_gather_start(void* data, std::size_t n, DType dtype) override {
    const std::size_t block = blocks_of(n, "all_gather_start");
    const void* mine = static_cast<std::byte*>(data) + std::size_t(rank_) * block * dtype_size(dtype);
    return start_on_side("all_gather_start", [&](cudaStream_t side) {
      return ncclAllGather(mine, data, block, nccl_type(dtype), comm_, side);
    }, n);
  }

  std::unique_ptr<PendingOp> all_reduce_beside(void* data, std::size_t n, DType dtype) override {
    return start_on(beside_, kSum, "all_reduce_beside", [&](cudaStream_t side) {
      return ncclAllReduce(data, data, n, nccl_type(dtype), ncclSum, comm_, side);
    }, n);
  }
  std::unique_ptr<PendingOp> reduce_scatter_beside(const void* send, void* recv,
                                                   std::size_t recv_count, DType dtype) override {
    PPTRAIN_CHECK(send != recv, name_ + ": reduce_scatter_beside is out of place");
    return start_on(beside_, kSum, "reduce_scatter_beside", [&](cudaStream_t side) {
      return ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), ncclSum, comm_, side);
    }, recv_count);
  }
  std::unique_ptr<PendingOp> all_gather_beside(const void* send, void* recv,
                                               std::size_t send_count, DType dtype) override {
    return start_on(beside_, kGather, "all_gather_beside", [&](cudaStream_t side) {
      return ncclAllGather(send, recv, send_count, nccl_type(dtype), comm_, side);
    }, send_count);
  }
  bool works_beside() const override { return true; }
  std::unique_ptr<PendingOp> broadcast_beside(const void* send, void* recv, std::size_t count,
                                              DType dtype, int root) override {
    check_root(root, "broadcast_beside");
    return start_on(beside_, kBroadcast, "broadcast_beside", [&](cudaStream_t side) {
      return ncclBroadcast(send, recv, count, nccl_type(dtype), root, comm_, side);
    }, count);
  }
  std::unique_ptr<PendingOp> reduce_beside(const void* send, void* recv, std::size_t count,
                                           DType dtype, int root) override {
    check_root(root, "reduce_beside");
    return start_on(beside_, kReduce, "reduce_beside", [&](cudaStream_t side) {
      return ncclReduce(send, recv, count, nccl_type(dtype), ncclSum, root, comm_, side);
    }, count);
  }

 private:
  // A stream beside compute and its two stream_wait sites: the operation after the
  // compute stream's earlier work, and the compute stream's later work after it.
  struct Sites {
    const char* ready;
    const char* done;
  };
  static constexpr Sites kSide{"collective-after-compute", "compute-after-collective"};
  static constexpr Sites kSum{"sum-after-compute", "compute-after-sum"};
  static constexpr Sites kGather{"gather-after-compute", "compute-after-gather"};
  static constexpr Sites kBroadcast{"broadcast-after-compute", "compute-after-broadcast"};
  static constexpr Sites kReduce{"reduce-after-compute", "compute-after-reduce"};

  void check_root(int root, const char* op) const {
    PPTRAIN_CHECK(root >= 0 && root < size(), std::string(op) + " on " + name_ + ": root " +
                                                  std::to_string(root) + " is not a member");
  }

  template <class Call>
  std::unique_ptr<PendingOp> start_on_side(const char* name, Call&& call, std::size_t n) {
    return start_on(ctx_->comm_stream(), kSide, name, std::forward<Call>(call), n);
  }
  // Queues `call` on `side` after the work already on the compute stream (which produced
  // its data); returns the op, watched from then on.
  template <class Call>
  std::unique_ptr<PendingOp> start_on(cudaStream_t side, Sites sites, const char* name, Call&& call,
                                      std::size_t n) {
    NcclOpInfo op = info(name);
    cudaEvent_t ready = ctx_->record(ctx_->compute_stream(), op);
    ctx_->stream_wait(sites.ready, side, ready, op);
    ctx_->check(cudaEventDestroy(ready), "cudaEventDestroy", op);  // the wait is queued
    cudaEvent_t begin = ctx_->begin_span(side, op);
    if (n > 0) ctx_->check(call(side), name, op);
    if (begin) ctx_->end_span(begin, side, name_, name, op);
    cudaEvent_t done = ctx_->record(side, op);
    return std::make_unique<NcclPending>(ctx_, comm_, done, std::move(op), sites.done);
  }
  cudaStream_t stream() const { return ctx_->compute_stream(); }
  NcclOpInfo info(const char* op) const { return {op, name_, peers_}; }

  std::shared_ptr<NcclContext> ctx_;
  ncclComm_t comm_;  // owned by ctx_
  std::string name_;
  std::vector<int> members_;
  Awaited peers_;  // the members, for messages
  int rank_ = 0;
  cudaStream_t beside_;  // the *_beside collectives' stream
};

}  // namespace

std::unique_ptr<Group> make_nccl_group(std::shared_ptr<NcclContext> ctx, ncclComm_t comm,
                                       std::string name, std::vector<int> members,
                                       cudaStream_t beside) {
  return std::make_unique<NcclGroup>(std::move(ctx), comm, std::move(name), std::move(members),
                                     beside);
}

}  // namespace pptrain::comm::detail
