// The watchdog: every MPI operation is started non-blocking and waited here by polling,
// so a peer that never arrives ends the job with a message instead of a silent hang.
#include "comm/mpi_wait.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "core/error.hpp"

namespace pptrain::comm::detail {

void abort_job(int world_rank, const std::string& message, int exit_code) {
  std::fprintf(stderr, "pptrain: rank %d: %s\n", world_rank, message.c_str());
  std::fflush(nullptr);
  // MPI_Abort asks the launcher to end every rank. With the launcher out of reach (a cut
  // link between this host and srun's) PMIx_Abort waits for an answer for ever: the rank
  // then ends itself after a grace period, and the other hosts' ranks end by their own
  // watchdogs.
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceS));
    std::_Exit(exit_code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

void check_mpi(int rc, const char* call, const WaitInfo& info) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  abort_job(info.world_rank,
            call + std::string(" failed in ") + info.op + " on group " + info.group + ": " +
                std::string(text, static_cast<std::size_t>(len)) + "; aborting",
            kExitRunFailure);
}

namespace {

// Indices of the requests that have not completed (requests are left untouched).
std::vector<std::size_t> pending_requests(std::vector<MPI_Request>& requests,
                                          const WaitInfo& info) {
  std::vector<std::size_t> pending;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    check_mpi(MPI_Request_get_status(requests[i], &flag, MPI_STATUS_IGNORE),
              "MPI_Request_get_status", info);
    if (!flag) pending.push_back(i);
  }
  return pending;
}

}  // namespace

std::string span_name(const char* op, std::size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s %.3g MiB", op, double(bytes) / (1 << 20));
  return buf;
}

std::function<void()> timed(const std::shared_ptr<CommTimeline>& timeline, std::string track,
                            std::string name, std::function<void()> then) {
  if (!timeline || !timeline->on()) return then;
  return [timeline, track = std::move(track), name = std::move(name), then = std::move(then),
          begin = CommSpan::Clock::now()] {
    timeline->add({track, name, begin, CommSpan::Clock::now()});
    if (then) then();
  };
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

std::string timeout_message(const std::string& op, const std::string& group,
                            double timeout_s, const std::string& peers) {
  return op + " on group " + group + " did not complete within " + seconds_text(timeout_s) +
         " s (peers: " + peers + "); aborting";
}

void wait_all(std::vector<MPI_Request>& requests, const WaitInfo& info) {
  using Clock = std::chrono::steady_clock;
  constexpr int kSpins = 1000;
  constexpr auto kMaxSleep = std::chrono::microseconds(100);
  auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(info.timeout_s);
  bool deferred = false;  // once, when every awaited peer answered (kLivenessDeferS)
  auto sleep = std::chrono::microseconds(1);
  const int n = static_cast<int>(requests.size());
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Testall(n, requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall",
              info);
    if (done) return;
    if (polls < kSpins) continue;
    if (info.timeout_s > 0 && Clock::now() - start > limit) {
      Awaited peers = info.peers ? info.peers(pending_requests(requests, info)) : Awaited{};
      if (info.liveness) {
        const std::vector<int> silent = info.liveness->silent(peers.ranks);
        if (silent.empty() && !deferred) {
          deferred = true;
          start += std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double>(kLivenessDeferS));
          continue;
        }
        peers.text += "; " + Liveness::report(silent);
      }
      abort_job(info.world_rank, timeout_message(info.op, info.group, info.timeout_s, peers.text),
                kExitRunFailure);
    }
    if (info.liveness) info.liveness->answer();
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

int mpi_count(std::size_t n, const char* op) {
  PPTRAIN_CHECK(n <= static_cast<std::size_t>(INT_MAX),
                std::string(op) + ": " + std::to_string(n) + " elements exceed INT_MAX");
  return static_cast<int>(n);
}

Awaited awaited_transfers(const std::vector<Transfer>& batch,
                          const std::vector<std::size_t>& which) {
  Awaited awaited;
  for (std::size_t i : which) {
    awaited.text += (awaited.text.empty() ? "" : ", ") + describe(batch[i]);
    awaited.ranks.push_back(batch[i].peer);
  }
  return awaited;
}

std::vector<int> every_rank(int size) {
  std::vector<int> ranks(static_cast<std::size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return s;
}

}  // namespace pptrain::comm::detail
