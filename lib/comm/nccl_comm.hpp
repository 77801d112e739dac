// NCCL communicators for arrays in GPU memory, bootstrapped over MPI: one
// ncclUniqueId per group, made by the group's rank 0 and broadcast inside the group's
// MPI communicator. Built only with the CUDA backend (nccl_*.cpp).
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "core/host_waits.hpp"

namespace pptrain::comm {

// True when this build has NCCL communicators.
bool nccl_built();

// Adds comms.device: a World and the tp, dp, pp and embedding groups of `grid` over
// NCCL, created on every rank in the same order, on the current CUDA device. Collectives
// and transfers are ordered after the work already queued on `compute_stream` (a
// cudaStream_t) and the compute stream waits for them, except the *_start collectives,
// which run on a stream of their own so gradient reduction overlaps the backward pass,
// and the tp group's *_beside ones, on another. The host
// does not wait for them: the watchdog watches every queued operation, from the host's
// waits and from World::check_progress; an operation that fails, or is not complete
// comms.timeout_s seconds after it was queued, aborts the communicators (ncclCommAbort)
// and ends the job with kExitRunFailure, naming rank, group and operation. Every host
// wait on the device counts in `host_waits` (when given). `pipeline_channels`, the
// same list on every rank, gives the pipeline's messages channels of their own
// (DeviceComms::pipeline: a two-rank communicator and a stream each); empty, they go
// through DeviceComms::world on the compute stream. Collective over the world.
// Throws std::runtime_error when NCCL is not built.
void add_nccl_comms(Comms& comms, const RankGrid& grid, void* compute_stream,
                    HostWaitCounter* host_waits = nullptr,
                    const std::vector<PipelineChannel>& pipeline_channels = {});

}  // namespace pptrain::comm
