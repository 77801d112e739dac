// Internal to lib/comm: the liveness check behind the watchdog's message. A rank whose
// wait timed out asks the peers it waited for whether they are alive, over a
// communicator of their own, so that the message can name the peer that is lost rather
// than every member of the group.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace pptrain::comm {
class MpiSession;
}

namespace pptrain::comm::detail {

// How long a rank waits for its peers' answers before it names the silent ones.
inline constexpr double kLivenessGraceS = 1.0;
// When every awaited peer answers, the fault (if any) is a rank that one of them waits
// for, and that peer's watchdog names it: a rank whose peers all answered keeps waiting
// this much longer (the operation may still complete), then asks again and ends the job.
inline constexpr double kLivenessDeferS = 3.0;

// One per rank, shared by every MPI communicator of it. A rank answers its peers'
// questions while it polls in any wait (answer), so a peer that is alive but waiting
// elsewhere answers, and one that is gone, frozen or cut off does not.
class Liveness {
 public:
  // Takes ownership of comm, a duplicate of MPI_COMM_WORLD used for nothing else.
  Liveness(std::shared_ptr<MpiSession> session, MPI_Comm comm);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Answers every question that has arrived. Never blocks.
  void answer();
  // Asks each of `peers` (world ranks; this rank and repeats are skipped) and, while
  // answering others, waits up to kLivenessGraceS for the answers. Returns the peers
  // that did not answer, in ascending order.
  std::vector<int> silent(const std::vector<int>& peers);
  // For the watchdog line, from silent()'s result: "no answer within 1 s from 2,3", or
  // "every peer answered within 1 s" when none is lost (they wait somewhere else).
  static std::string report(const std::vector<int>& silent);

 private:
  void post_question_receive();

  std::shared_ptr<MpiSession> session_;  // keeps MPI alive until comm_ is freed
  MPI_Comm comm_;
  int rank_ = 0;
  MPI_Request question_ = MPI_REQUEST_NULL;  // the posted receive of any peer's question
};

}  // namespace pptrain::comm::detail
