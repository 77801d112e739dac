// The emulated NCCL's communicator creation. An id names the process that made it (its
// world rank) and that process's count of ids. ncclCommInitRank blocks: each member
// registers with the id's creator, which must itself be a member; the creator checks the
// rank counts and that every rank joins once, then answers every member with the table of
// world ranks by NCCL rank and a tag slot unused by all of them. A creation that cannot
// complete (ranks creating communicators in different orders, a rank missing) fails on
// every rank involved after PPTRAIN_EMULATED_NCCL_INIT_TIMEOUT_S seconds (default 60),
// naming the communicator and the missing ranks, instead of hanging.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "emulator_nccl.hpp"

namespace pptrain_emu::nccl_emu {

std::set<const ncclComm*>& handles();  // emulator_nccl_comm.cpp

namespace {

constexpr char kMagic[16] = {'p', 'p', 't', 'r', 'a', 'i', 'n', '-',
                             'e', 'm', 'u', '-', 'n', 'c', 'c', 'l'};
struct IdBody {
  char magic[16];
  std::int32_t creator, world_size;
  std::uint64_t counter;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES);

struct Join {
  std::uint64_t counter;
  std::int32_t nranks, rank, next_slot, pad;
};
struct ReplyHead {
  std::uint64_t counter;
  std::int32_t ok, slot, nranks, pad;
  char text[640];
};

std::uint64_t ids_made = 0;
int next_slot = 1;  // slot 0 carries creation

using Clock = std::chrono::steady_clock;

double init_timeout_s() {
  const char* text = std::getenv("PPTRAIN_EMULATED_NCCL_INIT_TIMEOUT_S");
  if (text == nullptr) return 60.0;
  char* end = nullptr;
  const double s = std::strtod(text, &end);
  return end != text && s > 0 ? s : 60.0;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

void nap(int& polls) {
  if (++polls > 100)
    std::this_thread::sleep_for(std::chrono::microseconds(polls > 1000 ? 1000 : 50));
}

ncclResult_t mpi_ready(const char* call) {
  if (!mpi_usable())
    return fail(ncclInvalidUsage, std::string(call) +
                                      ": MPI is not initialised (the emulated "
                                      "NCCL runs over MPI_COMM_WORLD; call MPI_Init_thread first)");
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (flag == 0 || *ub < 2 * kTagBase - 1)
    return fail(ncclSystemError, std::string(call) + ": MPI_TAG_UB is below " +
                                     std::to_string(2 * kTagBase - 1) +
                                     ", the tags the emulated NCCL reserves");
  return ncclSuccess;
}

std::string ranks_text(const std::vector<int>& world) {
  std::string missing, joined;
  for (std::size_t r = 0; r < world.size(); ++r) {
    if (world[r] < 0)
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    else
      joined += (joined.empty() ? "" : ", ") + std::to_string(r) + " = world rank " +
                std::to_string(world[r]);
  }
  return "missing ranks: " + missing + " (joined: " + joined + ")";
}

void reply(int to, const ReplyHead& head, const std::vector<int>& world) {
  std::vector<std::byte> message(sizeof head + world.size() * sizeof(int));
  std::memcpy(message.data(), &head, sizeof head);
  if (!world.empty())
    std::memcpy(message.data() + sizeof head, world.data(), world.size() * sizeof(int));
  MPI_Send(message.data(), static_cast<int>(message.size()), MPI_BYTE, to,
           tag(0, Channel::Reply, head.counter), MPI_COMM_WORLD);
}

// Collects the members' registrations and answers them; on success fills world and slot.
ncclResult_t create(const IdBody& id, const std::string& name, int nranks, int rank,
                    std::vector<int>& world, int& slot) {
  const int me = world_rank();
  world.assign(static_cast<std::size_t>(nranks), -1);
  world[static_cast<std::size_t>(rank)] = me;
  slot = next_slot;
  std::vector<int> members;  // world ranks that joined, but this one
  ReplyHead head{};
  head.counter = id.counter;
  head.nranks = nranks;
  const auto answer_all = [&](bool ok, const std::string& text) {
    head.ok = ok ? 1 : 0;
    head.slot = slot;
    std::snprintf(head.text, sizeof head.text, "%s", text.c_str());
    for (int m : members) reply(m, head, ok ? world : std::vector<int>{});
  };
  const double limit = init_timeout_s();
  const auto deadline = Clock::now() + std::chrono::duration<double>(limit);
  const int join_tag = tag(0, Channel::Join, id.counter);
  for (int joined = 1, polls = 0; joined < nranks;) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, join_tag, MPI_COMM_WORLD, &flag, &status);
    if (flag == 0) {
      if (Clock::now() > deadline) {
        const std::string text = name + " (nranks " + std::to_string(nranks) +
                                 ") was not complete after " + seconds(limit) + ": " +
                                 ranks_text(world) +
                                 "; communicators must be created in the same order on every "
                                 "rank, from one id, with the same nranks";
        answer_all(false, text);
        return fail_loudly(ncclInvalidUsage, "ncclCommInitRank: " + text);
      }
      nap(polls);
      continue;
    }
    Join j;
    const int from = status.MPI_SOURCE;
    MPI_Recv(&j, sizeof j, MPI_BYTE, from, join_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (j.counter != id.counter) continue;  // an abandoned creation's late registration
    std::string problem;
    const std::string who = "world rank " + std::to_string(from);
    if (j.nranks != nranks)
      problem = who + " joins as rank " + std::to_string(j.rank) + " of " +
                std::to_string(j.nranks) + " ranks, but the creator (world rank " +
                std::to_string(me) + ") passed nranks " + std::to_string(nranks);
    else if (std::find(world.begin(), world.end(), from) != world.end())
      problem = who + " joins twice (one process is one rank of a communicator)";
    else if (world[static_cast<std::size_t>(j.rank)] >= 0)
      problem = "world ranks " + std::to_string(world[static_cast<std::size_t>(j.rank)]) + " and " +
                std::to_string(from) + " both join as rank " + std::to_string(j.rank);
    members.push_back(from);
    if (!problem.empty()) {
      answer_all(false, name + ": " + problem);
      return fail_loudly(ncclInvalidUsage, "ncclCommInitRank: " + name + ": " + problem);
    }
    world[static_cast<std::size_t>(j.rank)] = from;
    slot = std::max(slot, static_cast<int>(j.next_slot));
    ++joined;
  }
  if (slot > kMaxSlot) {
    const std::string text = name + ": a process may create at most " + std::to_string(kMaxSlot) +
                             " emulated communicators";
    answer_all(false, text);
    return fail_loudly(ncclInternalError, "ncclCommInitRank: " + text);
  }
  answer_all(true, "");
  return ncclSuccess;
}

// Registers with the creator and waits for its answer.
ncclResult_t join(const IdBody& id, const std::string& name, int nranks, int rank,
                  std::vector<int>& world, int& slot) {
  Transfers registration;
  const Join j{id.counter, nranks, rank, next_slot, 0};
  registration.send(&j, sizeof j, id.creator, tag(0, Channel::Join, id.counter), false);
  // Longer than the creator's limit, so that its report, naming the missing ranks, comes.
  const double limit = init_timeout_s() + 5.0;
  const auto deadline = Clock::now() + std::chrono::duration<double>(limit);
  const int reply_tag = tag(0, Channel::Reply, id.counter);
  MPI_Status status;
  for (int flag = 0, polls = 0; flag == 0;) {
    MPI_Iprobe(id.creator, reply_tag, MPI_COMM_WORLD, &flag, &status);
    registration.test();
    if (flag != 0) break;
    if (Clock::now() > deadline)
      return fail_loudly(
          ncclInvalidUsage,
          "ncclCommInitRank: " + name + ": rank " + std::to_string(rank) +
              " had no answer from the id's creator (world rank " + std::to_string(id.creator) +
              ") after " + seconds(limit) +
              ": it has not called ncclCommInitRank with this id (communicators must be created "
              "in the same order on every rank, and the rank that calls ncclGetUniqueId must "
              "join the communicator)");
    nap(polls);
  }
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  std::vector<std::byte> message(static_cast<std::size_t>(bytes));
  MPI_Recv(message.data(), bytes, MPI_BYTE, id.creator, reply_tag, MPI_COMM_WORLD,
           MPI_STATUS_IGNORE);
  while (!registration.test()) {
  }
  ReplyHead head;
  std::memcpy(&head, message.data(), sizeof head);
  head.text[sizeof head.text - 1] = '\0';
  if (head.ok == 0)
    return fail_loudly(ncclInvalidUsage, std::string("ncclCommInitRank: ") + head.text);
  world.assign(static_cast<std::size_t>(nranks), -1);
  std::memcpy(world.data(), message.data() + sizeof head, world.size() * sizeof(int));
  slot = head.slot;
  return ncclSuccess;
}

}  // namespace

}  // namespace pptrain_emu::nccl_emu

namespace pptrain_emu::nccl {

using namespace pptrain_emu::nccl_emu;  // NOLINT

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  if (const ncclResult_t rc = mpi_ready("ncclGetUniqueId"); rc != ncclSuccess) return rc;
  IdBody body{};
  std::memcpy(body.magic, kMagic, sizeof kMagic);
  body.creator = world_rank();
  MPI_Comm_size(MPI_COMM_WORLD, &body.world_size);
  body.counter = ++ids_made;
  std::memset(uniqueId->internal, 0, sizeof uniqueId->internal);
  std::memcpy(uniqueId->internal, &body, sizeof body);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is null");
  *comm = nullptr;
  if (const ncclResult_t rc = mpi_ready("ncclCommInitRank"); rc != ncclSuccess) return rc;
  IdBody id;
  std::memcpy(&id, commId.internal, sizeof id);
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (std::memcmp(id.magic, kMagic, sizeof kMagic) != 0 || id.world_size != world_size ||
      id.creator < 0 || id.creator >= world_size)
    return fail_loudly(ncclInvalidArgument,
                       "ncclCommInitRank: commId was not made by ncclGetUniqueId in this job");
  const std::string name =
      "communicator " + std::to_string(id.creator) + "." + std::to_string(id.counter);
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail_loudly(ncclInvalidArgument, "ncclCommInitRank: " + name + ": rank " +
                                                std::to_string(rank) + " is not in [0, nranks " +
                                                std::to_string(nranks) + ")");
  auto state = std::make_shared<Comm>();
  state->name = name;
  state->rank = rank;
  state->nranks = nranks;
  cudaGetDevice(&state->device);
  const ncclResult_t rc = id.creator == world_rank()
                              ? create(id, name, nranks, rank, state->world, state->slot)
                              : join(id, name, nranks, rank, state->world, state->slot);
  if (rc != ncclSuccess) return rc;
  next_slot = state->slot + 1;
  state->next_send.assign(static_cast<std::size_t>(nranks), 0);
  state->next_recv.assign(static_cast<std::size_t>(nranks), 0);
  auto* handle = new ncclComm{std::move(state)};
  handles().insert(handle);
  *comm = handle;
  return ncclSuccess;
}

}  // namespace pptrain_emu::nccl
