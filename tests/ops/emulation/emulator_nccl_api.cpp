// The emulated NCCL's collectives and point-to-point calls as called: the checks of
// the communicator, the arguments and the memory (every buffer's full extent must lie in
// one allocation of the communicator's device), then the operation goes to submit()
// (emulator_nccl_group.cpp).
#include <cstdio>
#include <string>

#include "emulator_nccl.hpp"
#include "emulator_streams.hpp"

namespace pptrain_emu::nccl_emu {

namespace {

std::string range_text(const void* p, std::size_t bytes) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%p, +%zu bytes)", p, bytes);
  return buf;
}

ncclResult_t check_buffer(const Comm& c, const std::string& call, const char* which, const void* p,
                          std::size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  const int device = device_of(p, bytes);
  if (device == c.device) return ncclSuccess;
  const std::string where = call + " on " + c.name + ": " + which + " " + range_text(p, bytes);
  if (device < 0)
    return refuse(ncclInvalidArgument,
                  where +
                      " is not inside one device allocation (host memory, or a range that "
                      "leaves its allocation); NCCL needs device memory");
  return refuse(ncclInvalidArgument, where + " is memory of device " + std::to_string(device) +
                                         ", but the communicator's device is " +
                                         std::to_string(c.device));
}

// Two ranges must be the same start (NCCL's in-place form, given as `in_place`) or
// disjoint.
ncclResult_t check_overlap(const Comm& c, const std::string& call, const void* send,
                           std::size_t send_bytes, const void* recv, std::size_t recv_bytes,
                           const void* in_place, const char* form) {
  const auto* s = static_cast<const char*>(send);
  const auto* r = static_cast<const char*>(recv);
  if (send_bytes == 0 || recv_bytes == 0 || recv == in_place) return ncclSuccess;
  if (s + send_bytes <= r || r + recv_bytes <= s) return ncclSuccess;
  return refuse(ncclInvalidArgument, call + " on " + c.name +
                                         ": sendbuff and recvbuff overlap but are not NCCL's "
                                         "in-place form (" +
                                         form + ")");
}

ncclResult_t common(ncclComm_t handle, const char* call, ncclDataType_t type, cudaStream_t stream,
                    std::shared_ptr<Comm>* comm) {
  if (const ncclResult_t rc = lookup(handle, call, comm); rc != ncclSuccess)
    return refuse(rc, last_error_text());
  if (type_size(type) == 0)
    return refuse(ncclInvalidArgument, std::string(call) + ": datatype " +
                                           std::to_string(static_cast<int>(type)) + " is invalid");
  if (stream_check(stream) != cudaSuccess)
    return refuse(ncclInvalidArgument, std::string(call) + ": stream is not a valid stream");
  return ncclSuccess;
}

ncclResult_t check_rank(const Comm& c, const char* call, const char* what, int r) {
  if (r >= 0 && r < c.nranks) return ncclSuccess;
  return refuse(ncclInvalidArgument, std::string(call) + " on " + c.name + ": " + what + " " +
                                         std::to_string(r) + " is not in [0, " +
                                         std::to_string(c.nranks) + ")");
}

ncclResult_t collective(ncclComm_t handle, const CollArgs& a, cudaStream_t stream) {
  const char* call = coll_name(a.kind);
  std::shared_ptr<Comm> comm;
  if (const ncclResult_t rc = common(handle, call, a.type, stream, &comm); rc != ncclSuccess)
    return rc;
  const Comm& c = *comm;
  const bool reduces =
      a.kind == Coll::AllReduce || a.kind == Coll::Reduce || a.kind == Coll::ReduceScatter;
  if (reduces && (a.op < 0 || a.op >= ncclNumOps))
    return refuse(ncclInvalidArgument,
                  std::string(call) + ": op " + std::to_string(a.op) + " is invalid");
  if (a.kind == Coll::Broadcast || a.kind == Coll::Reduce)
    if (const ncclResult_t rc = check_rank(c, call, "root", a.root); rc != ncclSuccess) return rc;
  const std::size_t block = a.count * type_size(a.type), n = static_cast<std::size_t>(c.nranks);
  const bool root = c.rank == a.root;
  std::size_t send_bytes = block, recv_bytes = block;
  const void* in_place = a.send;
  const char* form = "sendbuff == recvbuff";
  if (a.kind == Coll::ReduceScatter) {
    send_bytes = block * n;
    in_place = static_cast<const char*>(a.send) + static_cast<std::size_t>(c.rank) * block;
    form = "recvbuff == sendbuff + rank * recvcount";
  } else if (a.kind == Coll::AllGather) {
    recv_bytes = block * n;
    // In place when sendbuff == recvbuff + rank * sendcount: compare from the other side.
    const char* expected =
        static_cast<const char*>(a.recv) + static_cast<std::size_t>(c.rank) * block;
    in_place = expected == a.send ? a.recv : nullptr;
    form = "sendbuff == recvbuff + rank * sendcount";
  }
  if (a.kind == Coll::Broadcast && !root) send_bytes = 0;  // ignored off the root
  if (a.kind == Coll::Reduce && !root) recv_bytes = 0;
  const std::string name = call;
  if (const ncclResult_t rc = check_buffer(c, name, "sendbuff", a.send, send_bytes);
      rc != ncclSuccess)
    return rc;
  if (const ncclResult_t rc = check_buffer(c, name, "recvbuff", a.recv, recv_bytes);
      rc != ncclSuccess)
    return rc;
  if (const ncclResult_t rc =
          check_overlap(c, name, a.send, send_bytes, a.recv, recv_bytes, in_place, form);
      rc != ncclSuccess)
    return rc;
  return submit(stream, [comm, a] { return make_collective(comm, a); });
}

}  // namespace

}  // namespace pptrain_emu::nccl_emu

namespace pptrain_emu::nccl {

using namespace pptrain_emu::nccl_emu;  // NOLINT

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, std::size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(comm, {Coll::AllReduce, sendbuff, recvbuff, count, datatype, op, 0}, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, std::size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(comm, {Coll::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root},
                    stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, std::size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  return collective(comm, {Coll::Reduce, sendbuff, recvbuff, count, datatype, op, root}, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, std::size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, {Coll::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0},
                    stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, std::size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return collective(comm, {Coll::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0},
                    stream);
}

namespace {

ncclResult_t point_to_point(const char* call, const void* buf, std::size_t count,
                            ncclDataType_t type, int peer, ncclComm_t handle, cudaStream_t stream,
                            bool is_send) {
  std::shared_ptr<Comm> comm;
  if (const ncclResult_t rc = common(handle, call, type, stream, &comm); rc != ncclSuccess)
    return rc;
  if (const ncclResult_t rc = check_rank(*comm, call, "peer", peer); rc != ncclSuccess) return rc;
  if (const ncclResult_t rc = check_buffer(*comm, call, is_send ? "sendbuff" : "recvbuff", buf,
                                           count * type_size(type));
      rc != ncclSuccess)
    return rc;
  return submit(stream, [comm, buf, count, type, peer, is_send] {
    return is_send ? make_send(comm, buf, count, type, peer)
                   : make_recv(comm, const_cast<void*>(buf), count, type, peer);
  });
}

}  // namespace

ncclResult_t ncclSend(const void* sendbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point("ncclSend", sendbuff, count, datatype, peer, comm, stream, true);
}

ncclResult_t ncclRecv(void* recvbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point("ncclRecv", recvbuff, count, datatype, peer, comm, stream, false);
}

}  // namespace pptrain_emu::nccl
