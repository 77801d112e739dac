// Everything one rank of a run needs, built once at start-up: the rank grid, every
// communicator (MPI when the layout has more than one rank), the numeric backend, the
// rank's part of the model and the pipeline executor that runs it.
#pragma once
#include <memory>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "comm/comm.hpp"
#include "config/config.hpp"
#include "core/error.hpp"
#include "model/model.hpp"
#include "model/ring_attention.hpp"
#include "ops/ops.hpp"
#include "pipeline/executor.hpp"
#include "topology/rank_grid.hpp"
#include "topology/sequence_split.hpp"
#include "train/memory_check.hpp"

namespace pptrain {

// The CUDA devices this config may use (0 for device: cpu, without asking the runtime),
// and whether it runs on CUDA: device cuda, or auto with a device visible.
int visible_gpus(const Config& config);
bool runs_on_cuda(const Config& config);
// The backend for config.device: "cpu"; "cuda" (InputError when this build has no CUDA
// backend or no device is visible) on device local_rank modulo the device count, in
// train.precision; "auto": CUDA when a device is visible, else the CPU (where
// train.precision: bf16 is an InputError).
std::unique_ptr<ops::Ops> make_backend(const Config& config, int local_rank = 0);

// InputError when the schedule cannot run this layout (checked before any rank starts).
void check_schedule(const Config& config);
// Where the config's schedule puts the virtual stages, and the rank grid that follows
// (its embedding groups join the first stage to the head's stage).
Placement placement_of(const Config& config);
// The part of the model, and its arena's padding, of pipeline stage `stage` and tensor
// rank `tp_rank`.
ModelPartition rank_partition(const Config& config, int stage, int tp_rank);
RankGrid make_grid(const Config& config);
// How pipeline messages travel (parallel.message_mode): auto is sends in the background
// on the host (MPI) and, on a device, NCCL channels with parallel.overlap, else grouped
// batches on the compute stream. InputError for async-sends on a device.
MessageMode message_mode(const Config& config, bool device_memory);
// parallel.schedule_costs: the F, B and W times schedules are planned with.
StageCosts planned_costs(const Config& config);
// train.recompute and train.recompute_layers, with whether the schedule runs W right
// after B.
ActivationPolicy activation_policy(const Config& config);

struct Session {
  explicit Session(const Config& config);
  // The NCCL communicators go first: they run on the backend's stream.
  ~Session() { comms.device.reset(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  bool logs() const { return rank == 0; }  // rank 0 logs and writes run files
  // Whether this rank holds the head (the last virtual stage) and computes the loss.
  bool head_stage() const { return coord.pp == grid.head_stage(); }

  Config cfg;
  RankGrid grid;
  comm::Comms comms;
  int rank;
  RankCoord coord;
  SequenceSplit split;  // the positions of every sequence this rank holds
  std::unique_ptr<ops::Ops> ops;
  std::unique_ptr<Model> owned_model;  // the config's architecture (make_model)
  Model& model;
  PipelineExecutor executor;
};

// Runs f(session). In a multi-rank run an exception on one rank ends the whole job
// (its peers would otherwise wait for it): the message is printed and every rank exits
// with 2 for bad input, 1 otherwise. A one-rank run rethrows.
template <typename F>
auto run_all_or_none(Session& s, F&& f) {
  try {
    return f(s);
  } catch (const InputError& e) {
    if (s.grid.world_size() > 1) s.comms.world->abort(std::string("error: ") + e.what(), 2);
    throw;
  } catch (const ops::OutOfMemory& e) {
    if (s.grid.world_size() > 1)
      s.comms.world->abort(std::string("failed: ") + e.what() + predicted_peak_note(s.cfg), 1);
    throw;
  } catch (const std::exception& e) {
    if (s.grid.world_size() > 1) s.comms.world->abort(std::string("failed: ") + e.what(), 1);
    throw;
  }
}

// InputError when the checkpoint at `path` (its meta) was saved by another model shape
// than config.model, even one whose tensors fit (n_head changes no shape).
void check_same_model(const Config& config, const CheckpointMeta& meta, const std::string& path);

// Sum over ranks of `value` from the ranks for which `contributes` is true: a result
// only some ranks hold (the last stage's loss) made known to every rank.
double share(Session& s, double value, bool contributes);

// Mean loss over consecutive windows of seq_len+1 tokens of `tokens`, in order, the
// last partial window dropped; at most max_batches * batch windows when max_batches > 0.
// Collective: every rank calls it; every rank gets the result.
double validation_loss(Session& s, const std::vector<int32_t>& tokens, int max_batches);

}  // namespace pptrain
