// MPI start-up: the session (init/finalize) and every communicator of the rank grid,
// split from a private duplicate of MPI_COMM_WORLD in one fixed order on every rank.
#include <mpi.h>

#include <algorithm>
#include <stdexcept>

#include "comm/mpi_impl.hpp"
#include "comm/mpi_wait.hpp"
#include "core/error.hpp"

namespace pptrain::comm {

MpiSession::MpiSession() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw std::runtime_error("MPI was already finalized and cannot restart");
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    throw std::runtime_error("MPI_Init_thread failed");
  owns_ = true;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

int MpiSession::world_rank() const {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int MpiSession::world_size() const {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

namespace {

using detail::check_mpi;
using detail::WaitInfo;

WaitInfo startup_info(int rank, double timeout_s) {
  return {"start-up", "world", rank, timeout_s,
          [](const std::vector<std::size_t>&) { return detail::Awaited{"all", {}}; },
          nullptr};
}

// All ranks meet (under the watchdog) and agree on the grid; throws on every rank alike
// when they do not.
void check_same_grid(const RankGrid& grid, int rank, double timeout_s) {
  int v[8] = {grid.tp(), grid.cp(), grid.dp(), grid.pp(),
              -grid.tp(), -grid.cp(), -grid.dp(), -grid.pp()};
  WaitInfo info = startup_info(rank, timeout_s);
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, v, 8, MPI_INT, MPI_MAX, MPI_COMM_WORLD, req.data()),
            "MPI_Iallreduce", info);
  detail::wait_all(req, info);
  for (int i = 0; i < 4; ++i)
    if (v[i] != -v[i + 4]) throw InputError("ranks disagree on the parallel layout (tp, cp, dp, pp)");
}

// Splits base by colour (< 0: not a member) with key = position in members, so the
// group rank is the index into the grid's list.
std::unique_ptr<Group> split(const detail::MpiShared& shared, MPI_Comm base, int colour,
                             const std::vector<int>& members, std::string name) {
  const int rank = shared.world_rank;
  const auto it = std::find(members.begin(), members.end(), rank);
  const int key = it == members.end() ? 0 : static_cast<int>(it - members.begin());
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(base, colour < 0 ? MPI_UNDEFINED : colour, key, &comm),
            "MPI_Comm_split", startup_info(rank, shared.timeout_s));
  if (colour < 0) return nullptr;
  PPTRAIN_CHECK(it != members.end(), name + ": rank is not in its own group");
  MPI_Comm_set_name(comm, name.c_str());
  auto group = detail::make_mpi_group(shared, comm, name, members);
  PPTRAIN_CHECK(group->size() == static_cast<int>(members.size()) && group->rank() == key,
                name + ": MPI group does not match the rank grid");
  return group;
}

// "kind(a=1,b=2)", and ",cp=3" before the ")" when cp >= 0.
std::string coords(const char* kind, const char* a, int av, const char* b, int bv, int cp = -1) {
  return std::string(kind) + "(" + a + "=" + std::to_string(av) + "," + b + "=" +
         std::to_string(bv) + (cp >= 0 ? ",cp=" + std::to_string(cp) : std::string()) + ")";
}

}  // namespace

Comms make_mpi_comms(const RankGrid& grid, double timeout_s) {
  PPTRAIN_CHECK(timeout_s > 0, "make_mpi_comms: the timeout must be positive");
  auto session = std::make_shared<MpiSession>();
  const int rank = session->world_rank(), size = session->world_size();
  if (grid.world_size() != size)
    throw InputError("the parallel layout tp=" + std::to_string(grid.tp()) +
                     (grid.cp() > 1 ? " cp=" + std::to_string(grid.cp()) : std::string()) +
                     " dp=" + std::to_string(grid.dp()) + " pp=" + std::to_string(grid.pp()) +
                     " needs " + std::to_string(grid.world_size()) + " ranks, but the job has " +
                     std::to_string(size));
  check_same_grid(grid, rank, timeout_s);

  // Private communicators whose errors return codes (checked, then a one-line abort):
  // one to split the groups from and for point-to-point, one for the liveness check.
  const WaitInfo info = startup_info(rank, timeout_s);
  MPI_Comm base = MPI_COMM_NULL, liveness = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &base), "MPI_Comm_dup", info);
  check_mpi(MPI_Comm_set_errhandler(base, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", info);
  check_mpi(MPI_Comm_dup(base, &liveness), "MPI_Comm_dup", info);
  Comms comms;
  const detail::MpiShared shared{session, std::make_shared<detail::Liveness>(session, liveness),
                                 rank, timeout_s, comms.timeline};

  const RankCoord c = grid.coord(rank);
  const auto cp_of = [&grid](const RankCoord& at) { return grid.cp() > 1 ? at.cp : -1; };
  comms.timeout_s = timeout_s;
  comms.all = split(shared, base, 0, detail::every_rank(size), "world");
  comms.tp = split(shared, base, grid.tp_group_index(rank), grid.tp_group(rank),
                   coords("tp", "dp", c.dp, "pp", c.pp, cp_of(c)));
  comms.dp = split(shared, base, grid.replica_group_index(rank), grid.replica_group(rank),
                   coords(grid.cp() > 1 ? "dp-cp" : "dp", "tp", c.tp, "pp", c.pp));
  comms.pp = split(shared, base, grid.pp_group_index(rank), grid.pp_group(rank),
                   coords("pp", "tp", c.tp, "dp", c.dp, cp_of(c)));
  comms.embedding = split(shared, base, grid.embedding_group_index(rank),
                          grid.embedding_group(rank), coords("embedding", "tp", c.tp, "dp", c.dp, cp_of(c)));
  comms.world = detail::make_mpi_world(shared, base);
  return comms;
}

}  // namespace pptrain::comm
