// Run under mpirun with 2 ranks; rank 1 misbehaves so that rank 0 would wait forever:
//   collective  rank 1 never joins a TP all-reduce       (watchdog, 1 s)
//   exchange    rank 1 never sends what rank 0 receives  (watchdog, 1 s)
//   abort       rank 1 calls World::abort while rank 0 sits in a barrier
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
  if (mode != "collective" && mode != "exchange" && mode != "abort") {
    std::fprintf(stderr, "usage: %s collective|exchange|abort\n", argv[0]);
    return 2;
  }
  Comms c = make_mpi_comms(RankGrid(2, 1, 1), mode == "abort" ? 60.0 : 1.0);
  std::vector<float> data(16, 1.0f);
  if (c.world->rank() == 1) {
    if (mode == "abort") c.world->abort("rank one gives up");
    std::this_thread::sleep_for(std::chrono::seconds(60));  // killed long before
    return 0;
  }
  if (mode == "collective") c.tp->all_reduce(data.data(), data.size(), ReduceOp::Sum);
  if (mode == "exchange") c.world->exchange({{Transfer::Recv, 1, data.data(), 16, 7}});
  if (mode == "abort") c.world->barrier();
  std::fprintf(stderr, "rank 0 was not stopped\n");
  return 0;
}
