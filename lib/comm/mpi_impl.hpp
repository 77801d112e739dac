// Internal to lib/comm: the MPI group and world implementations, made by make_mpi_comms.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"

namespace pptrain::comm::detail {

// Takes ownership of comm (freed on destruction); members are world ranks by group rank.
std::unique_ptr<Group> make_mpi_group(std::shared_ptr<MpiSession> session, MPI_Comm comm,
                                      std::string name, std::vector<int> members,
                                      int world_rank, double timeout_s);

// Takes ownership of comm, a duplicate of MPI_COMM_WORLD used only for point-to-point.
std::unique_ptr<World> make_mpi_world(std::shared_ptr<MpiSession> session, MPI_Comm comm,
                                      double timeout_s);

}  // namespace pptrain::comm::detail
