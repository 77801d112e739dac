// Internal to lib/comm: what the NCCL groups and world of one DeviceComms share (their
// communicators, the streams, the host world that carries start-up, barriers and
// aborts), the checks that end the job on an NCCL or CUDA error, and the watchdog wait.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_timeline.hpp"
#include "comm/mpi_wait.hpp"
#include "core/host_waits.hpp"

namespace pptrain::comm::detail {

// What an operation is, for error and watchdog messages.
struct NcclOpInfo {
  std::string op;     // "all_reduce_start", "exchange", ...
  std::string group;  // group name
  Awaited peers;      // members or transfers
};

// Owns every NCCL communicator of one DeviceComms and the stream of all_reduce_start.
// An error or a timeout anywhere aborts all of them (ncclCommAbort), then ends the job
// through the host world, so no rank is left waiting in a collective. Times the
// operations on streams beside compute for the trace (DeviceSpanSource).
class NcclContext final : public DeviceSpanSource {
 public:
  // host_world must outlive the context (Comms destroys `device` before `world`), and
  // host_waits (may be null) too.
  NcclContext(World& host_world, cudaStream_t compute, double timeout_s,
              HostWaitCounter* host_waits);
  // Waits for the device, then destroys the communicators, newest first. Does not touch
  // the compute stream, which may already be gone.
  ~NcclContext() override;
  NcclContext(const NcclContext&) = delete;
  NcclContext& operator=(const NcclContext&) = delete;

  // Creates the communicator of one group (members: world ranks by group rank; this
  // rank must be one): members[0] makes the id and sends it to the others over the
  // host world with `tag`, then every member joins. Collective over the members.
  ncclComm_t add_comm(const std::vector<int>& members, const std::string& name, int tag);

  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t comm_stream() const { return comm_stream_; }
  // A new non-blocking stream, owned by the context (destroyed with it).
  cudaStream_t new_stream(const NcclOpInfo& info);
  int world_rank() const { return world_rank_; }
  World& host_world() const { return host_world_; }

  // Ends the job naming the call and the operation unless rc is success.
  void check(ncclResult_t rc, const char* call, const NcclOpInfo& info);
  void check(cudaError_t rc, const char* call, const NcclOpInfo& info);

  // A new event recorded on `stream`.
  cudaEvent_t record(cudaStream_t stream, const NcclOpInfo& info);

  // Makes `consumer` wait for `event`: every cross-stream dependency goes through here,
  // named by `site`. In the emulated build (PPTRAIN_EMULATED_GPU) the environment
  // variable PPTRAIN_DROP_STREAM_WAIT=<site> drops that one wait, so tests can show that
  // each is needed and that its absence is caught.
  void stream_wait(const char* site, cudaStream_t consumer, cudaEvent_t event,
                   const NcclOpInfo& info);

  // Blocks until `done` has completed, polling it and comm's asynchronous error; past
  // the timeout (if > 0) prints the watchdog line and ends the job. One host wait.
  void wait(cudaEvent_t done, ncclComm_t comm, const NcclOpInfo& info);

  // Takes `done` (recorded after an operation the host does not wait for) and watches
  // it from check_progress until it completes.
  void watch(cudaEvent_t done, ncclComm_t comm, NcclOpInfo info);
  // Watches the compute stream's work queued so far, as the whole world's operation
  // `what` (a replayed graph).
  void watch_queue(const std::string& what);
  // Whether the compute stream captures a CUDA graph: what is queued then runs only when
  // the graph is launched, so its events can be neither queried nor waited for.
  bool capturing() const;
  // Drops the watched operations that have completed; ends the job when one failed or
  // has been queued longer than the timeout. Never blocks.
  void check_progress();

  // Aborts every communicator, then ends the job through the host world.
  [[noreturn]] void abort(const std::string& message, int exit_code);

  // Trace spans: while on (start), begin_span records a timing event on `stream` before
  // an operation (null when off) and end_span, given a non-null one, one after the
  // operation (callers build the names only then: transfers run on the hot path).
  cudaEvent_t begin_span(cudaStream_t stream, const NcclOpInfo& info);
  void end_span(cudaEvent_t begin, cudaStream_t stream, std::string track, std::string name,
                const NcclOpInfo& info);
  void start(bool on) override;
  std::vector<CommSpan> take(CommSpan::Clock::time_point origin) override;

 private:
  World& host_world_;
  cudaStream_t compute_;
  cudaStream_t comm_stream_ = nullptr;
  std::vector<cudaStream_t> streams_;  // new_stream's
  double timeout_s_;
  int world_rank_;
  // Ends the job naming `info` once `since` is more than the timeout ago, unless every
  // awaited peer answers the liveness check: then, once (`deferred`), `since` moves on
  // by kLivenessDeferS.
  void check_age(std::chrono::steady_clock::time_point& since, bool& deferred,
                 const NcclOpInfo& info);

  struct Watched {
    cudaEvent_t done;
    ncclComm_t comm;
    NcclOpInfo info;
    std::chrono::steady_clock::time_point queued;
    bool deferred = false;
  };
  HostWaitCounter* host_waits_;
  struct Span {
    std::string track, name;
    cudaEvent_t begin, end;
  };
  bool spans_on_ = false;
  cudaEvent_t reference_ = nullptr;  // time zero of the spans, on the compute stream
  std::vector<Span> spans_;
  void drop_spans();  // destroys their events and the reference
  std::vector<ncclComm_t> comms_;  // in creation order
  std::vector<Watched> watched_;   // oldest first
  bool aborted_ = false;
};

// A started operation: the event recorded after it. wait() blocks under the watchdog
// until the event has completed, so any work queued afterwards, on any stream, comes
// after the operation; test() only queries the event. One queued during a graph capture
// runs only in the graph's launches: it never tests complete, the host cannot wait for
// it, and wait_in_queue orders the compute stream after it inside the graph, which the
// watchdog watches as a whole (World::watch_queue).
class NcclPending final : public PendingOp {
 public:
  // wait_site: the stream_wait site of wait_in_queue.
  NcclPending(std::shared_ptr<NcclContext> ctx, ncclComm_t comm, cudaEvent_t done,
              NcclOpInfo info, const char* wait_site = "compute-after-collective");
  ~NcclPending() override;
  void wait() override;
  bool test() override;
  void wait_in_queue() override;  // the compute stream waits on the event; the context watches it

 private:
  std::shared_ptr<NcclContext> ctx_;
  ncclComm_t comm_;
  cudaEvent_t done_;
  NcclOpInfo info_;
  const char* wait_site_;
  bool complete_ = false;
  bool captured_;
};

// What every World over an NcclContext shares: its rank and size, exchange() as
// exchange_start() with the compute stream waiting for it, and barriers and aborts
// through the host world.
class NcclWorldBase : public World {
 public:
  NcclWorldBase(std::shared_ptr<NcclContext> ctx, int size) : ctx_(std::move(ctx)), size_(size) {}
  int rank() const override { return ctx_->world_rank(); }
  int size() const override { return size_; }
  void exchange(const std::vector<Transfer>& batch) override {
    exchange_start(batch)->wait_in_queue();
  }
  void check_progress() override { ctx_->check_progress(); }
  void watch_queue(const std::string& what) override { ctx_->watch_queue(what); }
  void barrier() override { ctx_->host_world().barrier(); }
  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    ctx_->abort(message, exit_code);
  }

 protected:
  std::shared_ptr<NcclContext> ctx_;
  int size_;
};

// `beside`: the stream of the group's *_beside collectives (null: the context's
// communication stream, which the *_start ones use).
std::unique_ptr<Group> make_nccl_group(std::shared_ptr<NcclContext> ctx, ncclComm_t comm,
                                       std::string name, std::vector<int> members,
                                       cudaStream_t beside = nullptr);
// Point-to-point over `comm`, whose rank i is world rank members[i] (of `size`), with
// peers named by world rank. On the compute stream; or, given a stream of its own,
// there after the compute stream's earlier work (site "exchange-after-compute"), and
// wait_in_queue makes the compute stream wait (site "compute-after-exchange").
std::unique_ptr<World> make_nccl_world(std::shared_ptr<NcclContext> ctx, ncclComm_t comm,
                                       int size, std::vector<int> members,
                                       cudaStream_t own_stream = nullptr);

// One channel of the pipeline's messages as this rank sees it: its name, the world rank
// at its other end, whether this rank sends on it, its number, its two-rank communicator
// (sender rank 0, receiver rank 1) and this rank's stream for it.
struct ChannelLane {
  std::string name;  // "pipeline-channel-0(0->1)"
  int peer;
  bool send;
  int channel;
  ncclComm_t comm;
  cudaStream_t stream;
};
// Point-to-point on channels (nccl_channels.cpp): a transfer goes on the lane of its
// peer, direction and Transfer::channel.
std::unique_ptr<World> make_nccl_channel_world(std::shared_ptr<NcclContext> ctx, int size,
                                               std::vector<ChannelLane> lanes);

}  // namespace pptrain::comm::detail
