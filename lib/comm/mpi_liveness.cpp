// The liveness check: zero-byte questions and answers on a private communicator. Zero
// bytes always travel eagerly, so neither side needs the other to have posted anything
// for a send to leave, and a question to a lost peer costs nothing. Errors are ignored:
// the check only words a message for a job that is about to end.
#include "comm/mpi_liveness.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/comm.hpp"
#include "comm/mpi_wait.hpp"

namespace pptrain::comm::detail {
namespace {
constexpr int kQuestionTag = 1;
constexpr int kAnswerTag = 2;
}  // namespace

Liveness::Liveness(std::shared_ptr<MpiSession> session, MPI_Comm comm)
    : session_(std::move(session)), comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  post_question_receive();
}

Liveness::~Liveness() {
  if (question_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&question_);
    MPI_Wait(&question_, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&comm_);
}

void Liveness::post_question_receive() {
  if (MPI_Irecv(nullptr, 0, MPI_BYTE, MPI_ANY_SOURCE, kQuestionTag, comm_, &question_) !=
      MPI_SUCCESS)
    question_ = MPI_REQUEST_NULL;
}

void Liveness::answer() {
  while (question_ != MPI_REQUEST_NULL) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Test(&question_, &arrived, &status) != MPI_SUCCESS || !arrived) return;
    MPI_Request sent = MPI_REQUEST_NULL;
    if (MPI_Isend(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, kAnswerTag, comm_, &sent) ==
        MPI_SUCCESS)
      MPI_Request_free(&sent);  // completes on its own; nobody waits for it
    post_question_receive();
  }
}

std::vector<int> Liveness::silent(const std::vector<int>& peers) {
  std::vector<int> asked;
  for (int p : peers)
    if (p != rank_) asked.push_back(p);
  std::sort(asked.begin(), asked.end());
  asked.erase(std::unique(asked.begin(), asked.end()), asked.end());

  std::vector<MPI_Request> answers(asked.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < asked.size(); ++i) {
    MPI_Irecv(nullptr, 0, MPI_BYTE, asked[i], kAnswerTag, comm_, &answers[i]);
    MPI_Request sent = MPI_REQUEST_NULL;
    if (MPI_Isend(nullptr, 0, MPI_BYTE, asked[i], kQuestionTag, comm_, &sent) == MPI_SUCCESS)
      MPI_Request_free(&sent);
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(kLivenessGraceS);
  for (;;) {
    answer();  // a peer asking at the same time must hear from this rank too
    int done = 0;
    MPI_Testall(static_cast<int>(answers.size()), answers.data(), &done, MPI_STATUSES_IGNORE);
    if (done || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::vector<int> quiet;
  for (std::size_t i = 0; i < asked.size(); ++i) {
    if (answers[i] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Test(&answers[i], &flag, MPI_STATUS_IGNORE);
    if (flag) continue;
    quiet.push_back(asked[i]);
    MPI_Cancel(&answers[i]);
    MPI_Request_free(&answers[i]);
  }
  return quiet;
}

std::string Liveness::report(const std::vector<int>& silent) {
  const std::string grace = seconds_text(kLivenessGraceS);
  if (silent.empty()) return std::string("every peer answered within ") + grace + " s";
  return std::string("no answer within ") + grace + " s from " + join_ranks(silent);
}

}  // namespace pptrain::comm::detail
