// The NCCL communicators of one DeviceComms: start-up over the host world, the checks
// that end the job on an error, the watchdog wait, abort and teardown.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/mpi_wait.hpp"
#include "comm/nccl_impl.hpp"
#include "core/error.hpp"

namespace pptrain::comm::detail {

NcclContext::NcclContext(World& host_world, cudaStream_t compute, double timeout_s,
                         HostWaitCounter* host_waits)
    : host_world_(host_world), compute_(compute), timeout_s_(timeout_s),
      world_rank_(host_world.rank()), host_waits_(host_waits) {
  // Gradient reduction runs beside the backward pass: give it the highest priority so
  // its kernels get SMs as soon as any free up.
  const NcclOpInfo info{"start-up", "world", {"all", {}}};
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
  for (const Watched& w : watched_) (void)cudaEventDestroy(w.done);
  drop_spans();
  for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) (void)ncclCommDestroy(*it);
  if (comm_stream_) (void)cudaStreamDestroy(comm_stream_);
  for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
}

cudaStream_t NcclContext::new_stream(const NcclOpInfo& info) {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", info);
  streams_.push_back(s);
  return s;
}

ncclComm_t NcclContext::add_comm(const std::vector<int>& members, const std::string& name,
                                 int tag) {
  const NcclOpInfo info{"start-up", name, {join_ranks(members), members}};
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
        kExitRunFailure);
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

namespace {
// True once `done` has completed; ends the job through ctx when it or comm failed.
bool completed(NcclContext& ctx, cudaEvent_t done, ncclComm_t comm, const NcclOpInfo& info) {
  const cudaError_t state = cudaEventQuery(done);
  if (state == cudaSuccess) return true;
  if (state != cudaErrorNotReady) ctx.check(state, "cudaEventQuery", info);
  ncclResult_t async = ncclSuccess;
  ctx.check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", info);
  if (async != ncclSuccess && async != ncclInProgress)
    ctx.check(async, "an asynchronous NCCL operation", info);
  return false;
}
}  // namespace

void NcclContext::check_age(std::chrono::steady_clock::time_point& since, bool& deferred,
                            const NcclOpInfo& info) {
  using Clock = std::chrono::steady_clock;
  if (timeout_s_ <= 0 || Clock::now() - since <= std::chrono::duration<double>(timeout_s_))
    return;
  std::string peers = info.peers.text;
  if (const auto silent = host_world_.silent_peers(info.peers.ranks)) {
    if (silent->empty() && !deferred) {  // the fault is further on: see kLivenessDeferS
      deferred = true;
      since += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(kLivenessDeferS));
      return;
    }
    peers += "; " + Liveness::report(*silent);
  }
  abort(timeout_message(info.op, info.group, timeout_s_, peers), kExitRunFailure);
}

void NcclContext::stream_wait(const char* site, cudaStream_t consumer, cudaEvent_t event,
                              const NcclOpInfo& info) {
#ifdef PPTRAIN_EMULATED_GPU
  const char* drop = std::getenv("PPTRAIN_DROP_STREAM_WAIT");
  if (drop != nullptr && std::string(drop) == site) return;
#else
  (void)site;
#endif
  check(cudaStreamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent", info);
}

void NcclContext::wait(cudaEvent_t done, ncclComm_t comm, const NcclOpInfo& info) {
  constexpr int kSpins = 1000;
  constexpr auto kMaxSleep = std::chrono::microseconds(100);
  auto start = std::chrono::steady_clock::now();
  bool deferred = false;
  if (host_waits_) host_waits_->add();
  auto sleep = std::chrono::microseconds(1);
  for (int polls = 0;; ++polls) {
    if (completed(*this, done, comm, info)) return;
    if (polls < kSpins) continue;
    check_age(start, deferred, info);
    check_progress();  // an older queued operation may be what holds this one
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

void NcclContext::watch(cudaEvent_t done, ncclComm_t comm, NcclOpInfo info) {
  watched_.push_back({done, comm, std::move(info), std::chrono::steady_clock::now()});
}

void NcclContext::watch_queue(const std::string& what) {
  std::vector<int> everyone(std::size_t(host_world_.size()));
  for (std::size_t r = 0; r < everyone.size(); ++r) everyone[r] = int(r);
  NcclOpInfo info{what, "world", {join_ranks(everyone), everyone}};
  PPTRAIN_CHECK(!comms_.empty(), "watch_queue: no communicator");
  watch(record(compute_, info), comms_.front(), std::move(info));
}

bool NcclContext::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(compute_, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

void NcclContext::check_progress() {
  host_world_.answer_peers();  // the host polls here while the device waits
  // Operations complete in queue order on one stream, so the oldest unfinished one is
  // the one to name; the later ones wait behind it.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    Watched& w = watched_[i];
    if (completed(*this, w.done, w.comm, w.info)) {
      (void)cudaEventDestroy(w.done);
      continue;
    }
    check_age(w.queued, w.deferred, w.info);
    if (kept != i) watched_[kept] = std::move(w);
    ++kept;
  }
  watched_.resize(kept);
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

cudaEvent_t NcclContext::begin_span(cudaStream_t stream, const NcclOpInfo& info) {
  if (!spans_on_) return nullptr;
  cudaEvent_t event = nullptr;  // with timing, unlike record()'s
  check(cudaEventCreate(&event), "cudaEventCreate", info);
  check(cudaEventRecord(event, stream), "cudaEventRecord", info);
  return event;
}

void NcclContext::end_span(cudaEvent_t begin, cudaStream_t stream, std::string track,
                           std::string name, const NcclOpInfo& info) {
  cudaEvent_t end = begin_span(stream, info);
  spans_.push_back({std::move(track), std::move(name), begin, end});
}

void NcclContext::start(bool on) {
  drop_spans();
  spans_on_ = on;
  if (on) reference_ = begin_span(compute_, {"trace", "world", {"all", {}}});
}

std::vector<CommSpan> NcclContext::take(CommSpan::Clock::time_point origin) {
  std::vector<CommSpan> out;
  auto at = [&](cudaEvent_t e, CommSpan::Clock::time_point& t) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, reference_, e) != cudaSuccess) return false;
    t = origin + std::chrono::duration_cast<CommSpan::Clock::duration>(
                     std::chrono::duration<double, std::milli>(ms));
    return true;
  };
  for (Span& s : spans_) {
    CommSpan span{s.track, s.name, {}, {}};
    if (reference_ && at(s.begin, span.begin) && at(s.end, span.end)) out.push_back(std::move(span));
  }
  (void)cudaGetLastError();  // a span not yet complete is left out, not an error
  drop_spans();
  spans_on_ = false;
  return out;
}

void NcclContext::drop_spans() {
  for (const Span& s : spans_) {
    (void)cudaEventDestroy(s.begin);
    (void)cudaEventDestroy(s.end);
  }
  spans_.clear();
  if (reference_) (void)cudaEventDestroy(reference_);
  reference_ = nullptr;
}

NcclPending::NcclPending(std::shared_ptr<NcclContext> ctx, ncclComm_t comm, cudaEvent_t done,
                         NcclOpInfo info, const char* wait_site)
    : ctx_(std::move(ctx)), comm_(comm), done_(done), info_(std::move(info)),
      wait_site_(wait_site), captured_(ctx_->capturing()) {}

NcclPending::~NcclPending() {
  if (!captured_) wait();  // a captured one left unjoined fails the capture's end
  if (done_) (void)cudaEventDestroy(done_);
}

void NcclPending::wait() {
  PPTRAIN_CHECK(complete_ || !captured_,
                info_.op + " on " + info_.group + ": a host wait inside a CUDA graph capture");
  if (!complete_) ctx_->wait(done_, comm_, info_);
  complete_ = true;
}

void NcclPending::wait_in_queue() {
  if (complete_) return;
  ctx_->stream_wait(wait_site_, ctx_->compute_stream(), done_, info_);
  if (captured_) {
    ctx_->check(cudaEventDestroy(done_), "cudaEventDestroy", info_);  // the wait is captured
  } else {
    ctx_->watch(done_, comm_, std::move(info_));  // the context owns it now
  }
  done_ = nullptr;
  complete_ = true;  // for this object: nothing is left to wait for
}

bool NcclPending::test() {
  if (captured_) return false;  // it runs in the graph's launches only
  if (!complete_) {
    const cudaError_t state = cudaEventQuery(done_);
    if (state != cudaErrorNotReady) ctx_->check(state, "cudaEventQuery", info_);
    complete_ = state == cudaSuccess;
  }
  return complete_;
}

}  // namespace pptrain::comm::detail
