// The emulated NCCL's communicator handles after creation: lookup (every call on an
// unknown, destroyed or aborted handle fails), destroy, abort (in-flight messages are
// cancelled or abandoned and queued operations finish without touching memory), the
// asynchronous error and the queries; the error strings and the version.
#include <set>
#include <string>

#include "emulator_nccl.hpp"

namespace pptrain_emu::nccl_emu {

std::set<const ncclComm*>& handles() {
  static auto* known = new std::set<const ncclComm*>;  // never freed, as the handles
  return *known;
}

namespace {

// The state of a handle that may be used by `call` even after an asynchronous error.
ncclResult_t find(ncclComm_t handle, const char* call, std::shared_ptr<Comm>* out) {
  if (handle == nullptr || handles().count(handle) == 0)
    return fail(ncclInvalidArgument, std::string(call) + ": comm is not a communicator");
  const auto& state = handle->state;
  if (state->destroyed)
    return fail(ncclInvalidUsage, std::string(call) + ": " + state->name + " has been destroyed");
  if (state->aborted)
    return fail(ncclInvalidUsage,
                std::string(call) + ": " + state->name + " has been aborted (ncclCommAbort)");
  *out = state;
  return ncclSuccess;
}

}  // namespace

ncclResult_t lookup(ncclComm_t handle, const char* call, std::shared_ptr<Comm>* out) {
  std::shared_ptr<Comm> state;
  if (const ncclResult_t rc = find(handle, call, &state); rc != ncclSuccess) return rc;
  if (state->async_error != ncclSuccess)
    return fail(state->async_error, std::string(call) + ": " + state->name +
                                        " has an asynchronous error: " + state->error);
  *out = std::move(state);
  return ncclSuccess;
}

}  // namespace pptrain_emu::nccl_emu

namespace pptrain_emu::nccl {

using namespace pptrain_emu::nccl_emu;  // NOLINT

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "a CUDA call failed";
    case ncclSystemError: return "a system call failed";
    case ncclInternalError: return "an internal check failed";
    case ncclInvalidArgument: return "an argument is invalid";
    case ncclInvalidUsage: return "the call is incorrect (a programming error)";
    case ncclRemoteError: return "a remote process exited or the network failed";
    case ncclInProgress: return "the operation is in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error_text(); }

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<Comm> state;
  if (const ncclResult_t rc = find(comm, "ncclCommDestroy", &state); rc != ncclSuccess) return rc;
  // As NCCL's finalisation, operations still queued complete first.
  if (state->queued > 0) {
    int current = 0;
    (void)cudaGetDevice(&current);
    (void)cudaSetDevice(state->device);
    (void)cudaDeviceSynchronize();
    (void)cudaSetDevice(current);
  }
  if (state->queued > 0)
    return fail_loudly(ncclInvalidUsage, "ncclCommDestroy: " + state->name + " still has " +
                                             std::to_string(state->queued) +
                                             " queued operations after the device synchronised");
  state->destroyed = true;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<Comm> state;
  if (const ncclResult_t rc = find(comm, "ncclCommAbort", &state); rc != ncclSuccess) return rc;
  state->aborted = true;
  const std::vector<Op*> live = state->live;  // abandon() edits the list
  for (Op* op : live) op->abandon();
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (asyncError == nullptr)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is null");
  std::shared_ptr<Comm> state;
  if (const ncclResult_t rc = find(comm, "ncclCommGetAsyncError", &state); rc != ncclSuccess) {
    *asyncError = rc;
    return rc;
  }
  *asyncError = state->async_error;
  if (state->async_error != ncclSuccess) fail(state->async_error, state->error);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  std::shared_ptr<Comm> state;
  if (const ncclResult_t rc = find(comm, "ncclCommCount", &state); rc != ncclSuccess) return rc;
  if (count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: count is null");
  *count = state->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  std::shared_ptr<Comm> state;
  if (const ncclResult_t rc = find(comm, "ncclCommCuDevice", &state); rc != ncclSuccess) return rc;
  if (device == nullptr) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is null");
  *device = state->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  std::shared_ptr<Comm> state;
  if (const ncclResult_t rc = find(comm, "ncclCommUserRank", &state); rc != ncclSuccess) return rc;
  if (rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is null");
  *rank = state->rank;
  return ncclSuccess;
}

}  // namespace pptrain_emu::nccl
