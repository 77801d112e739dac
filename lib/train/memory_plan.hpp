// The predicted peak of backend memory per rank, from the parameter layout, the
// optimizer's sharding and the activation table walked through the rank's own schedule
// steps: what `check-config` prints and what the measured `peak_memory_mib` is held to.
#pragma once
#include "config/config.hpp"
#include "core/dtype.hpp"
#include "model/activation_table.hpp"
#include "pipeline/schedule.hpp"

namespace pptrain {

// What the backend of the run keeps per activation: its compute dtype, and whether its
// attention saves one log-sum-exp per row instead of the probabilities; and whose
// memory it is.
struct BackendTraits {
  DType compute = DType::F32;
  bool logsumexp_attention = false;
  bool device_memory = false;  // a GPU's (NCCL, grouped messages), else the host's
};

// Bytes, by what holds them.
struct RankMemory {
  int stage = 0, tp_rank = 0;
  double parameters = 0;  // the rank's tensors' elements (its shards, vocabulary padding included)
  // weights: the model's fp32 master; optimizer: the moments, and the master when the
  // optimizer holds it (optimizer_holds_master).
  double weights = 0, gradients = 0, weight_copy = 0, optimizer = 0;
  double checkpoint_gather = 0;  // a sharded master: one bucket gathered at a time while saving
  double activations = 0;        // the sets and lent parts at their schedule peaks
  double workspace = 0;          // the model's shared activation workspace
  double ring_buffers = 0;       // context parallelism: ring attention's blocks in flight
  // A CUDA backend's own: cuBLASLt's workspace and the most scratch a kernel asks for.
  double backend_scratch = 0;
  // Bytes a parameter for its weights, gradients, weight copy and optimizer state.
  double state_bytes_per_parameter() const {
    return (weights + gradients + weight_copy + optimizer) / parameters;
  }
  double total() const {
    return weights + gradients + weight_copy + optimizer + checkpoint_gather + activations +
           workspace + ring_buffers + backend_scratch;
  }
};

// The activation table's sizes for one micro-batch of a tensor-parallel shard, at the
// positions of a sequence a context-parallel rank holds.
ActivationShape activation_shape(const Config& config, const BackendTraits& backend);

// The backend a run of `config` gets: on CUDA (`cuda`: runs_on_cuda, or a GPU cluster)
// bf16 unless train.precision is fp32, the fused attention's log-sum-exp where it runs
// (on CUDA only in bf16); fp32 on the CPU.
BackendTraits backend_traits(const Config& config, bool cuda);
// The heaviest rank's.
RankMemory predict_peak_memory(const Config& config, const BackendTraits& backend);
// The same with the steps every stage runs already built (build_all_steps for the
// config's schedule, in the run's message mode), as the planner shares them.
RankMemory predict_peak_memory(const Config& config, const BackendTraits& backend,
                               const std::vector<std::vector<Step>>& steps);

}  // namespace pptrain
