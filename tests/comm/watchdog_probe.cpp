// Run under mpirun; one rank misbehaves so that the others would wait forever:
//   collective  (2 ranks) rank 1 never joins a TP all-reduce        (watchdog, 1 s)
//   exchange    (2 ranks) rank 1 never sends what rank 0 receives   (watchdog, 1 s)
//   abort       (2 ranks) rank 1 calls World::abort while rank 0 sits in a barrier
//   lost        (4 ranks) rank 3 never joins the all-reduce of 0, 1 and 2: whichever
//               times out first names 3 alone as silent, since the others answer
//   elsewhere   (2 ranks) rank 1 waits in a barrier while rank 0 waits in an
//               all-reduce: both are alive, and each says that the other answered
//   chain       (3 ranks) rank 0 waits for rank 1, which waits (from 0.5 s on) for rank
//               2, which never sends: rank 0 times out first but rank 1 answers it, so
//               rank 0 defers, and rank 1's line, naming 2, ends the job
// The job must end non-zero, fast, with the message; expect_failure.sh checks that.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.hpp"

using namespace pptrain;
using namespace pptrain::comm;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "collective" && mode != "exchange" && mode != "abort" && mode != "lost" &&
      mode != "elsewhere" && mode != "chain") {
    std::fprintf(stderr, "usage: %s collective|exchange|abort|lost|elsewhere|chain\n", argv[0]);
    return 2;
  }
  const int ranks = mode == "lost" ? 4 : mode == "chain" ? 3 : 2;
  Comms c = make_mpi_comms(RankGrid(ranks, 1, 1), mode == "abort" ? 60.0 : 1.0);
  std::vector<float> data(16, 1.0f);
  const int misbehaving = ranks - 1;
  if (c.world->rank() == misbehaving) {
    if (mode == "abort") c.world->abort("rank one gives up");
    if (mode == "elsewhere") c.world->barrier();
    std::this_thread::sleep_for(std::chrono::seconds(60));  // killed long before
    return 0;
  }
  if (mode == "collective" || mode == "lost" || mode == "elsewhere")
    c.tp->all_reduce(data.data(), data.size(), ReduceOp::Sum);
  if (mode == "exchange") c.world->exchange({{Transfer::Recv, 1, data.data(), 16, 7}});
  if (mode == "chain") {
    if (c.world->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    c.world->exchange({{Transfer::Recv, c.world->rank() + 1, data.data(), 16, 7}});
  }
  if (mode == "abort") c.world->barrier();
  std::fprintf(stderr, "rank %d was not stopped\n", c.world->rank());
  return 0;
}
