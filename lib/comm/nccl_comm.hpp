// NCCL communicators for arrays in GPU memory, bootstrapped over MPI: one
// ncclUniqueId per group, made by the group's rank 0 and broadcast inside the group's
// MPI communicator. Built only with the CUDA backend (nccl_*.cpp).
#pragma once
#include <memory>

#include "comm/comm.hpp"

namespace pptrain::comm {

// True when this build has NCCL communicators.
bool nccl_built();

// Adds comms.device: a World and the tp, dp and embedding groups of `grid` over NCCL,
// created on every rank in the same order, on the current CUDA device. Collectives and
// transfers are ordered after the work already queued on `compute_stream` (a
// cudaStream_t) and the compute stream waits for them, except all_reduce_start, which
// runs on a stream of its own so gradient reduction overlaps the backward pass. Waits
// poll ncclCommGetAsyncError; after comms.timeout_s seconds the communicators are
// aborted (ncclCommAbort) and the job exits with kExitCommFailure, naming rank, group
// and operation. Collective over the world. Throws std::runtime_error when NCCL is not
// built.
void add_nccl_comms(Comms& comms, const RankGrid& grid, void* compute_stream);

}  // namespace pptrain::comm
