// The communication interface: groups (collectives over a fixed set of ranks), the
// world (point-to-point by world rank) and the bundle of every communicator of a run.
// No MPI or NCCL header here: the MPI implementation lives in mpi_*.cpp, the NCCL one
// (device memory, CUDA builds) in nccl_*.cpp.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_timeline.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "topology/rank_grid.hpp"

namespace pptrain::comm {

enum class ReduceOp { Sum, Max };

// A started operation; wait() blocks (under the watchdog) until it completes. Waiting
// twice is harmless; destroying an op that was never waited waits for it first.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
  // True once the operation has completed (never blocks).
  virtual bool test() = 0;
  // Makes the work queued afterwards on the backend's compute stream wait for the
  // operation. On a device (NCCL) the host goes on at once and the watchdog keeps
  // watching it (World::check_progress); a host operation (MPI) is waited for here.
  virtual void wait_in_queue() { wait(); }
};

// A communicator over a fixed set of ranks, built at start-up. Every member must call
// the same collectives in the same order. Counts are elements, at most INT_MAX.
class Group {
 public:
  virtual ~Group() = default;
  virtual const std::string& name() const = 0;          // e.g. "tp(dp=0,pp=1)"
  virtual int rank() const = 0;                         // rank within the group
  virtual int size() const = 0;
  virtual const std::vector<int>& world_ranks() const = 0;  // members, by group rank

  // Arrays are in the memory the group is for: host memory (MPI), device memory (NCCL).
  virtual void all_reduce(float* data, std::size_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, std::size_t n, ReduceOp op) = 0;
  // Sum of an array of `dtype` (activations: bf16 on CUDA; MPI takes fp32 only).
  virtual void all_reduce(void* data, std::size_t n, DType dtype) = 0;
  // Sum; send holds size() * recv_count values of `dtype`, this rank keeps block rank().
  // send may equal recv (in place: the input is read from recv). MPI sums fp32 only.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                              DType dtype) = 0;
  // recv gets size() * send_count values of `dtype`, block r from group rank r. send may
  // point at this rank's own block of recv (in place).
  virtual void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype) = 0;
  void reduce_scatter(const float* send, float* recv, std::size_t recv_count) {
    reduce_scatter(send, recv, recv_count, DType::F32);
  }
  void all_gather(const float* send, float* recv, std::size_t send_count) {
    all_gather(send, recv, send_count, DType::F32);
  }
  virtual void broadcast(float* data, std::size_t n, int root) = 0;  // root: group rank
  // Non-blocking all-reduce (sum) for gradient buckets: start now, wait later. data must
  // stay alive and untouched until wait() returns.
  virtual std::unique_ptr<PendingOp> all_reduce_start(float* data, std::size_t n) = 0;
  // Non-blocking and in place, for ZeRO's buckets; n is a multiple of size() and block r
  // is the n / size() elements at data + r * n / size(). reduce_scatter_start: this
  // rank's block ends as the sum of every member's block rank(); the other blocks are
  // left undefined. all_gather_start: every member's own block ends on every member, in
  // any dtype (a gather moves bytes).
  virtual std::unique_ptr<PendingOp> reduce_scatter_start(float* data, std::size_t n) = 0;
  virtual std::unique_ptr<PendingOp> all_gather_start(void* data, std::size_t n, DType dtype) = 0;
  std::unique_ptr<PendingOp> all_gather_start(float* data, std::size_t n) {
    return all_gather_start(data, n, DType::F32);
  }
  // all_reduce(data, n, dtype), reduce_scatter(send, recv, recv_count, dtype) and
  // all_gather(send, recv, send_count, dtype) that the caller works beside: on a device
  // they run on a stream of the group's own, after the compute stream's earlier work, and
  // wait_in_queue() orders what follows after them; here they complete before returning
  // (null: nothing to wait for). The tensor-parallel input gradients, summed while the
  // weight gradients are computed, and the norms' outputs, gathered again for those
  // weight gradients while the input gradients are computed.
  virtual std::unique_ptr<PendingOp> all_reduce_beside(void* data, std::size_t n, DType dtype) {
    all_reduce(data, n, dtype);
    return nullptr;
  }
  virtual std::unique_ptr<PendingOp> reduce_scatter_beside(const void* send, void* recv,
                                                           std::size_t recv_count, DType dtype) {
    reduce_scatter(send, recv, recv_count, dtype);
    return nullptr;
  }
  virtual std::unique_ptr<PendingOp> all_gather_beside(const void* send, void* recv,
                                                       std::size_t send_count, DType dtype) {
    all_gather(send, recv, send_count, dtype);
    return nullptr;
  }
  // True where the *_beside collectives do run beside compute (a device); false where
  // they complete before returning (above).
  virtual bool works_beside() const { return false; }
  // Block-wise collectives beside compute, only where works_beside(): broadcast_beside
  // copies `count` values of `dtype` from the root's `send` into every member's `recv`;
  // reduce_beside sums every member's `send` into the root's `recv` (`recv` is unused
  // elsewhere). A tensor-parallel GEMM consumes a gathered input, or produces partial
  // sums, one row block at a time while the other blocks travel
  // (TensorParallelRegions::gather_rows, reduce_rows).
  virtual std::unique_ptr<PendingOp> broadcast_beside(const void*, void*, std::size_t, DType, int) {
    PPTRAIN_CHECK(false, name() + ": broadcast_beside needs a group that works beside compute");
    return nullptr;
  }
  virtual std::unique_ptr<PendingOp> reduce_beside(const void*, void*, std::size_t, DType, int) {
    PPTRAIN_CHECK(false, name() + ": reduce_beside needs a group that works beside compute");
    return nullptr;
  }

 protected:
  // n / size() for `op`'s blocks; a logic_error naming the group when n does not split.
  std::size_t blocks_of(std::size_t n, const char* op) const {
    const auto members = static_cast<std::size_t>(size());
    PPTRAIN_CHECK(n % members == 0, name() + ": " + op + " of " + std::to_string(n) +
                                        " elements does not split into " +
                                        std::to_string(members) + " blocks");
    return n / members;
  }

 public:
};

// One point-to-point message of `bytes` bytes to or from a world rank. Tags are >= 0 and small (the MPI
// guarantee is 32767); a send matches the receive of the same tag from this rank.
struct Transfer {
  enum Kind { Send, Recv } kind;
  int peer;
  void* data;
  std::size_t bytes;
  int tag;
  // Where transfers travel on channels (the pipeline's NCCL world): which of the
  // channels from the sender to the receiver. A channel's transfers match in issue
  // order; different channels' are independent. Host worlds match by tag and ignore it.
  int channel = 0;
};

// A channel of the pipeline's messages: world rank `from` sends to world rank `to`
// the transfers whose Transfer::channel is `channel`.
struct PipelineChannel {
  int from, to, channel;
  bool operator==(const PipelineChannel&) const = default;
};

// "send to P tag T" / "recv from P tag T", for messages about a transfer.
inline std::string describe(const Transfer& t) {
  return (t.kind == Transfer::Send ? "send to " : "recv from ") + std::to_string(t.peer) +
         " tag " + std::to_string(t.tag);
}

class World {
 public:
  virtual ~World() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts every transfer of the batch, then waits for all: a batch may mix sends and
  // receives, so neighbours exchanging in both directions cannot deadlock. On a device
  // (NCCL) the batch is queued on the compute stream, which waits for it; the host goes
  // on, and the watchdog watches it (check_progress).
  virtual void exchange(const std::vector<Transfer>& batch) = 0;
  // Starts the batch and returns; the buffers must stay alive until wait().
  virtual std::unique_ptr<PendingOp> exchange_start(const std::vector<Transfer>& batch) = 0;
  virtual void barrier() = 0;
  // The watchdog's look at the operations queued on a device and not yet complete, for
  // a host that waits on the device by other means (ops::Ops::wait_queue): ends the job
  // when one failed or has been queued longer than the timeout, naming the rank, group
  // and operation. Never blocks; nothing to do for host communicators.
  virtual void check_progress() {}
  // Watches the device work queued so far as one operation named `what`, from
  // check_progress: for a replayed CUDA graph, whose operations the host does not queue
  // one by one. Nothing to do for host communicators.
  virtual void watch_queue(const std::string& what) { (void)what; }
  // The liveness check behind the watchdog's message: asks `peers` (world ranks) over a
  // channel of its own whether they are alive, waits a second for the answers, and
  // returns those that were silent; nullopt where there is no such check.
  virtual std::optional<std::vector<int>> silent_peers(const std::vector<int>& peers) {
    (void)peers;
    return std::nullopt;
  }
  // Answers the peers' liveness checks that have arrived; every wait calls it while it
  // polls. Never blocks.
  virtual void answer_peers() {}
  // Prints "pptrain: rank R: <message>" to stderr; the whole job exits with
  // `exit_code` (1: a failure; 2: bad input).
  [[noreturn]] virtual void abort(const std::string& message, int exit_code = 1) = 0;
};

// Communicators for arrays in GPU memory (NCCL): the activations between stages and
// inside a tensor-parallel group, and the gradients. Host values still use Comms' MPI
// groups.
struct DeviceComms {
  std::unique_ptr<World> world;
  std::unique_ptr<Group> tp, dp, pp;  // dp as in Comms
  std::unique_ptr<Group> embedding;  // null on ranks in no embedding group
  // The context-parallel ring's exchanges (peers by world rank, within this rank's cp
  // group), on a stream of their own beside the compute stream; null when cp is 1.
  std::unique_ptr<World> ring;
  // The pipeline's messages on channels (PipelineChannel), each a communicator and a
  // stream of its own; null when the run's messages go through `world`.
  std::unique_ptr<World> pipeline;
};

// Every communicator of the run, created once at start-up on every rank in the same
// order. Destroy it before anything that outlives MPI (it may finalize MPI).
// The plain members take host memory; the *_for_model() accessors give what the
// model's arrays (backend memory) must use: the NCCL communicators when `device` is
// set, else the same host ones.
struct Comms {
  std::unique_ptr<World> world;
  std::unique_ptr<Group> all;  // every rank, named "world"
  // dp: the ranks holding the same parameters, whose gradients it sums: the data-parallel
  // group, or with context parallelism its dp * cp ranks (RankGrid::replica_group).
  std::unique_ptr<Group> tp, dp, pp;
  std::unique_ptr<Group> embedding;  // null on ranks in no embedding group
  std::unique_ptr<DeviceComms> device;  // null: the backend's memory is host memory
  double timeout_s = 0;                 // the watchdog limit of every wait (0: local, none)
  // The spans of the operations that run beside compute, for the trace; never null.
  std::shared_ptr<CommTimeline> timeline = std::make_shared<CommTimeline>();

  World& world_for_model() const { return device ? *device->world : *world; }
  // Where ring attention sends its blocks (model/ring_attention.hpp).
  World& ring_for_model() const {
    return device && device->ring ? *device->ring : world_for_model();
  }
  // Where the pipeline's messages travel (pipeline/executor.hpp).
  World& pipeline_for_model() const {
    return device && device->pipeline ? *device->pipeline : world_for_model();
  }
  Group* tp_for_model() const { return device ? device->tp.get() : tp.get(); }
  Group* dp_for_model() const { return device ? device->dp.get() : dp.get(); }
  Group* pp_for_model() const { return device ? device->pp.get() : pp.get(); }
  Group* embedding_for_model() const { return device ? device->embedding.get() : embedding.get(); }
};

// Keeps MPI initialised while it lives: initialises MPI (thread level SERIALIZED: one
// thread at a time may communicate) unless it already is, and finalizes it on
// destruction if it did the initialisation. Optional: make_mpi_comms makes its own.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int world_rank() const;
  int world_size() const;

 private:
  bool owns_ = false;
};

// Builds every group of the grid (MPI_Comm_split, colour = the grid's group index) on a
// private duplicate of MPI_COMM_WORLD, initialising MPI if needed; the returned
// communicators share one MpiSession, so MPI is finalized after the last is destroyed
// (unless the caller holds its own MpiSession, which then decides). Collective: every
// rank calls it with the same grid. Every later wait aborts the job after timeout_s.
// Throws InputError when the grid's size differs from the job's number of ranks.
Comms make_mpi_comms(const RankGrid& grid, double timeout_s);

// One-rank communicators (every group of size 1, no MPI at all) for single-process runs.
Comms make_local_comms();

}  // namespace pptrain::comm
