// The emulated NCCL's common parts (emulator_nccl.hpp): tags, error texts and the last
// error, messages in flight (Transfers), and the life of an operation (Op).
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>

#include "emulator_races.hpp"

#include "emulator_nccl.hpp"

namespace pptrain_emu::nccl_emu {

namespace {

std::string& last_error() {
  static std::string text;
  return text;
}

// Buffers MPI may still read or write after an abort: kept for the rest of the process.
std::vector<std::shared_ptr<std::vector<std::byte>>>& graveyard() {
  static auto* kept = new std::vector<std::shared_ptr<std::vector<std::byte>>>;
  return *kept;
}

constexpr std::size_t kChunk = std::size_t(1) << 30;  // bytes per MPI message

}  // namespace

int tag(int slot, Channel channel, std::uint64_t seq) {
  const auto low = static_cast<int>(seq & ((std::uint64_t(1) << kSeqBits) - 1));
  return kTagBase | (slot << (kSeqBits + kChannelBits)) | (static_cast<int>(channel) << kSeqBits) |
         low;
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

int world_rank() {
  int rank = -1;
  if (mpi_usable()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

ncclResult_t fail(ncclResult_t rc, const std::string& text) {
  last_error() = text;
  return rc;
}

ncclResult_t fail_loudly(ncclResult_t rc, const std::string& text) {
  std::fprintf(stderr, "emulated NCCL: world rank %d: %s\n", world_rank(), text.c_str());
  std::fflush(stderr);
  return fail(rc, text);
}

void set_async_error(Comm& comm, ncclResult_t rc, const std::string& text) {
  if (comm.async_error != ncclSuccess) return;
  comm.async_error = rc;
  comm.error = text;
  fail_loudly(rc, text);
}

const char* type_name(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "float16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
    default: return "unknown type";
  }
}

const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "unknown op";
  }
}

std::size_t type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* last_error_text() { return last_error().c_str(); }

// ---- Transfers ----

Transfers::~Transfers() { abandon(); }

void Transfers::send(const void* data, std::size_t bytes, int world_peer, int tag_value,
                     bool synchronous) {
  auto copy = std::make_shared<std::vector<std::byte>>(bytes);
  if (bytes != 0) std::memcpy(copy->data(), data, bytes);
  buffers_.push_back(copy);
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(kChunk, bytes - offset);
    MPI_Request request;
    auto* at = copy->data() + offset;
    if (synchronous)
      MPI_Issend(at, static_cast<int>(n), MPI_BYTE, world_peer, tag_value, MPI_COMM_WORLD,
                 &request);
    else
      MPI_Isend(at, static_cast<int>(n), MPI_BYTE, world_peer, tag_value, MPI_COMM_WORLD, &request);
    pending_.push_back({request, false});
    offset += n;
  } while (offset < bytes);
}

std::size_t Transfers::recv(std::size_t bytes, int world_peer, int tag_value) {
  auto into = std::make_shared<std::vector<std::byte>>(bytes);
  buffers_.push_back(into);
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(kChunk, bytes - offset);
    MPI_Request request;
    MPI_Irecv(into->data() + offset, static_cast<int>(n), MPI_BYTE, world_peer, tag_value,
              MPI_COMM_WORLD, &request);
    pending_.push_back({request, true});
    offset += n;
  } while (offset < bytes);
  return buffers_.size() - 1;
}

bool Transfers::test() {
  bool all = true;
  for (Pending& p : pending_) {
    if (p.request == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
    all = all && done != 0;
  }
  return all;
}

void Transfers::abandon() {
  bool in_flight = false;
  const bool usable = mpi_usable();
  for (Pending& p : pending_) {
    if (p.request == MPI_REQUEST_NULL) continue;
    if (!usable) {
      in_flight = true;  // MPI is gone: nothing may be called, keep the buffers
      continue;
    }
    if (p.is_recv) {
      MPI_Cancel(&p.request);
      int done = 0;
      MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
      if (done) continue;
    }
    MPI_Request_free(&p.request);  // MPI completes it on its own
    in_flight = true;
  }
  pending_.clear();
  if (in_flight)
    for (auto& b : buffers_) graveyard().push_back(std::move(b));
  buffers_.clear();
}

// ---- Op ----

Op::Op(std::shared_ptr<Comm> comm, std::string what)
    : comm_(std::move(comm)), what_(std::move(what)) {}

Op::~Op() {
  auto& live = comm_->live;
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
}

void Op::note_touches() const {
  for (const Touch& t : touched_) races::note(t.p, t.bytes, t.writes, what_.c_str());
}

void Op::post() {
  if (posted_ || finished_) return;
  posted_ = true;
  comm_->live.push_back(this);
  do_post();
}

bool Op::test() {
  if (finished_) return true;
  if (!do_test()) return false;
  finished_ = true;
  auto& live = comm_->live;
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
  return true;
}

void Op::abandon() {
  if (finished_) return;
  finished_ = true;
  auto& live = comm_->live;
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
  do_abandon();
}

}  // namespace pptrain_emu::nccl_emu
