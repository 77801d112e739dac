// Internal to lib/comm: waiting on MPI requests under the watchdog, and one-line
// aborts for MPI errors and timeouts, naming the rank, the group and the operation.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/mpi_liveness.hpp"

namespace pptrain::comm::detail {

// The peers a wait is held up by: words for the message and world ranks to ask.
struct Awaited {
  std::string text;  // "0,1,3", "recv from 2 tag 5", ...
  std::vector<int> ranks;
};

// What is being waited for, for the message when it fails.
struct WaitInfo {
  std::string op;     // "all_reduce", "exchange", ...
  std::string group;  // group name
  int world_rank = 0;
  double timeout_s = 0;
  // The peers of the still pending requests (indices into the request list).
  std::function<Awaited(const std::vector<std::size_t>& pending)> peers;
  // Answers peers' liveness checks while waiting, and asks the awaited peers before the
  // watchdog ends the job; null during start-up.
  std::shared_ptr<Liveness> liveness;
};

// How long a rank waits for MPI_Abort to end it before it ends itself.
inline constexpr int kAbortGraceS = 3;

// Prints "pptrain: rank R: <message>" as one line to stderr and ends the job; this rank
// ends within kAbortGraceS whether or not the launcher can be reached.
[[noreturn]] void abort_job(int world_rank, const std::string& message, int exit_code);

// Aborts the job naming the call and the operation when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* call, const WaitInfo& info);

// Waits for every request: tight polling first, then sleeps growing to 100 us. Past
// info.timeout_s (if > 0) asks the awaited peers whether they are alive; when all
// answer it waits kLivenessDeferS more, once, and asks again. Then it prints the
// watchdog line naming the silent peers and aborts the job.
void wait_all(std::vector<MPI_Request>& requests, const WaitInfo& info);

// Converts an element count for MPI, throwing (an internal error) when it exceeds INT_MAX.
int mpi_count(std::size_t n, const char* op);

// A started operation: its requests and how to describe them.
class MpiPending final : public PendingOp {
 public:
  // `then` (may be empty) runs once, on the host, when the requests have completed.
  MpiPending(std::vector<MPI_Request> requests, WaitInfo info, std::function<void()> then = {})
      : requests_(std::move(requests)), info_(std::move(info)), then_(std::move(then)) {}
  ~MpiPending() override { wait(); }
  void wait() override {
    if (!done_) wait_all(requests_, info_);
    complete();
  }
  bool test() override {
    if (!done_) {
      int flag = 0;
      MPI_Testall(int(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE);
      if (flag) complete();
    }
    return done_;
  }

 private:
  void complete() {
    if (done_) return;
    done_ = true;
    if (then_) then_();
  }
  std::vector<MPI_Request> requests_;
  WaitInfo info_;
  std::function<void()> then_;
  bool done_ = false;
};

// "0,1,3"
std::string join_ranks(const std::vector<int>& ranks);

// Transfers `which` (indices into batch) of a batch, for the watchdog.
Awaited awaited_transfers(const std::vector<Transfer>& batch,
                          const std::vector<std::size_t>& which);

// 0, 1, ..., size - 1
std::vector<int> every_rank(int size);

// "all_reduce 1.5 MiB": an operation and its size, for a trace span.
std::string span_name(const char* op, std::size_t bytes);

// `then`, after noting in `timeline` the span of operation `name` on `track` from now to
// when it runs (the host sees the operation complete), if the timeline is on.
std::function<void()> timed(const std::shared_ptr<CommTimeline>& timeline, std::string track,
                            std::string name, std::function<void()> then = {});

// "8", "0.5": seconds as the messages write them.
std::string seconds_text(double s);

// The watchdog line, for MPI and NCCL waits alike: "<op> on group <group> did not
// complete within <timeout> s (peers: <peers>); aborting".
std::string timeout_message(const std::string& op, const std::string& group,
                            double timeout_s, const std::string& peers);

}  // namespace pptrain::comm::detail
