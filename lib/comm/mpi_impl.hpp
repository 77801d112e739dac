// Internal to lib/comm: the MPI group and world implementations, made by make_mpi_comms.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/mpi_liveness.hpp"

namespace pptrain::comm::detail {

// What every MPI communicator of a rank shares.
struct MpiShared {
  std::shared_ptr<MpiSession> session;  // keeps MPI alive until the communicators are freed
  std::shared_ptr<Liveness> liveness;   // null during start-up
  int world_rank = 0;
  double timeout_s = 0;  // the watchdog limit of every wait
  std::shared_ptr<CommTimeline> timeline;  // the Comms' (never null)
};

// Takes ownership of comm (freed on destruction); members are world ranks by group rank.
std::unique_ptr<Group> make_mpi_group(MpiShared shared, MPI_Comm comm, std::string name,
                                      std::vector<int> members);

// Takes ownership of comm, a duplicate of MPI_COMM_WORLD used only for point-to-point.
std::unique_ptr<World> make_mpi_world(MpiShared shared, MPI_Comm comm);

}  // namespace pptrain::comm::detail
