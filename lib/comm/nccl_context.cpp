// The NCCL communicators of one DeviceComms: start-up over the host world, the checks
// that end the job on an error, the watchdog wait, abort and teardown.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/mpi_wait.hpp"
#include "comm/nccl_impl.hpp"
#include "core/error.hpp"

namespace pptrain::comm::detail {

namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

NcclContext::NcclContext(World& host_world, cudaStream_t compute, double timeout_s)
    : host_world_(host_world), compute_(compute), timeout_s_(timeout_s),
      world_rank_(host_world.rank()) {
  // Gradient reduction runs beside the backward pass: give it the highest priority so
  // its kernels get SMs as soon as any free up.
  const NcclOpInfo info{"start-up", "world", "all"};
  int least = 0, greatest = 0;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest),
        "cudaDeviceGetStreamPriorityRange", info);
  check(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest),
        "cudaStreamCreateWithPriority", info);
}

NcclContext::~NcclContext() {
  if (aborted_) return;
  // Nothing may still use a communicator when it is destroyed. Errors are ignored: at
  // teardown there is nothing left to do about them.
  (void)cudaDeviceSynchronize();
  for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) (void)ncclCommDestroy(*it);
  if (comm_stream_) (void)cudaStreamDestroy(comm_stream_);
}

ncclComm_t NcclContext::add_comm(const std::vector<int>& members, const std::string& name,
                                 int tag) {
  const NcclOpInfo info{"start-up", name, join_ranks(members)};
  const auto it = std::find(members.begin(), members.end(), world_rank_);
  PPTRAIN_CHECK(it != members.end(), name + ": rank is not in its own group");
  const int rank = static_cast<int>(it - members.begin());
  const int size = static_cast<int>(members.size());

  ncclUniqueId id{};
  if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId", info);
  std::vector<Transfer> batch;
  if (rank == 0) {
    for (int r = 1; r < size; ++r)
      batch.push_back({Transfer::Send, members[static_cast<std::size_t>(r)], &id, sizeof id, tag});
  } else {
    batch.push_back({Transfer::Recv, members[0], &id, sizeof id, tag});
  }
  host_world_.exchange(batch);  // under the host world's watchdog

  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank", info);
  comms_.push_back(comm);
  return comm;
}

void NcclContext::check(ncclResult_t rc, const char* call, const NcclOpInfo& info) {
  if (rc == ncclSuccess) return;
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += " (" + std::string(last) + ")";
  abort(std::string(call) + " failed in " + info.op + " on group " + info.group + ": " + text +
            "; aborting",
        kExitCommFailure);
}

void NcclContext::check(cudaError_t rc, const char* call, const NcclOpInfo& info) {
  if (rc == cudaSuccess) return;
  abort(std::string(call) + " failed in " + info.op + " on group " + info.group + ": " +
            cudaGetErrorString(rc) + "; aborting",
        kExitFailure);
}

cudaEvent_t NcclContext::record(cudaStream_t stream, const NcclOpInfo& info) {
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags",
        info);
  check(cudaEventRecord(event, stream), "cudaEventRecord", info);
  return event;
}

void NcclContext::wait(cudaEvent_t done, ncclComm_t comm, const NcclOpInfo& info) {
  using Clock = std::chrono::steady_clock;
  constexpr int kSpins = 1000;
  constexpr auto kMaxSleep = std::chrono::microseconds(100);
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s_);
  auto sleep = std::chrono::microseconds(1);
  for (int polls = 0;; ++polls) {
    const cudaError_t state = cudaEventQuery(done);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) check(state, "cudaEventQuery", info);
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", info);
    if (async != ncclSuccess && async != ncclInProgress)
      check(async, "an asynchronous NCCL operation", info);
    if (polls < kSpins) continue;
    if (timeout_s_ > 0 && Clock::now() - start > limit)
      abort(info.op + " on group " + info.group + " did not complete within " +
                seconds_text(timeout_s_) + " s (peers: " + info.peers + "); aborting",
            kExitCommFailure);
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

void NcclContext::abort(const std::string& message, int exit_code) {
  // Aborting the communicators first stops kernels still waiting for peers, so the
  // device is free when the job ends.
  if (!aborted_) {
    aborted_ = true;
    for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) (void)ncclCommAbort(*it);
  }
  host_world_.abort(message, exit_code);
  std::_Exit(exit_code);  // the host world's abort does not return; this satisfies [[noreturn]]
}

NcclPending::NcclPending(std::shared_ptr<NcclContext> ctx, ncclComm_t comm, cudaEvent_t done,
                         NcclOpInfo info)
    : ctx_(std::move(ctx)), comm_(comm), done_(done), info_(std::move(info)) {}

NcclPending::~NcclPending() {
  wait();
  (void)cudaEventDestroy(done_);
}

void NcclPending::wait() {
  if (!complete_) ctx_->wait(done_, comm_, info_);
  complete_ = true;
}

bool NcclPending::test() {
  if (!complete_) {
    const cudaError_t state = cudaEventQuery(done_);
    if (state != cudaErrorNotReady) ctx_->check(state, "cudaEventQuery", info_);
    complete_ = state == cudaSuccess;
  }
  return complete_;
}

}  // namespace pptrain::comm::detail
