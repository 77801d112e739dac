#include "train/memory_plan.hpp"

#include <algorithm>

#include "model/activation_table.hpp"
#include "model/param_layout.hpp"
#include "ops/ops.hpp"
#include "pipeline/activation_peaks.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/send_waits.hpp"
#include "optim/adamw.hpp"
#include "train/grad_buckets.hpp"
#include "train/session.hpp"

namespace pptrain {

ActivationShape activation_shape(const Config& c, const BackendTraits& be) {
  ActivationShape shape = model_activation_shape(c.model, c.parallel.micro_batch_size,
                                                 c.parallel.tp, dtype_size(be.compute));
  shape.seq_len = SequenceSplit{c.parallel.cp, 0, c.model.seq_len}.local_len();
  shape.attention_state_bytes =
      ops::attention_state_bytes(be.logsumexp_attention || c.parallel.cp > 1, be.compute,
                                 shape.batch, shape.seq_len, shape.heads);
  return shape;
}

namespace {

MessageMode run_mode(const Config& c, const BackendTraits& be) {
  return message_mode(c, be.device_memory);
}

std::vector<std::vector<Step>> run_steps(const Config& c, const BackendTraits& be) {
  const ParallelConfig& p = c.parallel;
  return build_all_steps(p.schedule, p.pp, p.micro_batches, p.virtual_stages, run_mode(c, be),
                         planned_costs(c));
}

// The steps every stage runs in the run's message mode and, for sends left to complete
// in the background, the step from which the rank reuses the sets they read.
struct PlannedSteps {
  const std::vector<std::vector<Step>>& steps;
  std::vector<std::vector<std::size_t>> reusable;  // empty with blocking batches
};

PlannedSteps planned_steps(const Config& c, const BackendTraits& be,
                           const std::vector<std::vector<Step>>& steps) {
  PlannedSteps plan{steps, {}};
  if (sends_in_background(run_mode(c, be)))
    plan.reusable = sends_waitable_from(steps, placement_of(c));
  return plan;
}

// What a CUDA backend holds besides the arrays (ops.hpp's sizes): cuBLASLt's workspace
// and one scratch block as large as the largest any of the model's kernels asks for: the
// bias gradients the weight-gradient products write apart, the norm weight-gradient
// column sums, attention's (context parallelism's ring steps instead: the fused
// backward's row dots of a piece, none for the loop kernels) or, on a rank holding the
// embedding, its table gradient's tile bits. A product cuBLASLt cannot
// fuse with its bias gradient sums the columns itself, in chunks (its warning says so),
// and asks for more. T: the positions a rank holds.
double cuda_backend_scratch(const Config& c, const BackendTraits& be, bool holds_embedding) {
  const ModelConfig& m = c.model;
  const int tp = c.parallel.tp, B = c.parallel.micro_batch_size;
  const SequenceSplit split{c.parallel.cp, 0, m.seq_len};
  const int T = split.local_len(), N = B * T;
  const int rows_held = c.parallel.sequence_parallel ? N / tp : N;
  const int C = m.d_model, heads = m.n_head / tp, hs = m.d_model / m.n_head;
  // GPT-2: bias gradients (widest: c_fc's 4C/t) and LayerNorm's two sums; llama: RMSNorm's one.
  const bool gpt = m.arch == Arch::Gpt2;
  std::size_t bias_sums = gpt ? std::size_t(std::max(C, 4 * C / tp)) : 0;
  if (gpt && split.cp > 1)  // a piece's position-table gradient: B rows of len * C
    bias_sums = std::max(bias_sums, ops::cuda_column_sum_floats(B, split.piece_len() * C));
  std::size_t scratch = 4 * std::max(bias_sums, (gpt ? 2 : 1) * ops::cuda_column_sum_floats(rows_held, C));
  const bool fused = be.logsumexp_attention && ops::cuda_fused_attention_head_size(hs);
  const bool probabilities_in_scratch = be.logsumexp_attention && !fused;
  for (bool backward : {false, true})
    if (split.cp == 1)
      scratch = std::max(scratch, ops::cuda_attention_scratch_bytes(
                                    backward, fused, probabilities_in_scratch, be.compute, B, T,
                                    heads, hs));
    else if (fused)
      scratch = std::max(scratch, ops::cuda_attention_scratch_bytes(
                                    backward, true, false, be.compute, B, split.piece_len(),
                                    heads, hs));
  if (holds_embedding)  // the table gradient's tile bits over this rank's vocabulary rows
    scratch = std::max(scratch, ops::cuda_embedding_scratch_bytes(
                                    vocab_rows_per_shard(m, tp), N));
  // The gradient norm's partial sums (and one more per tensor, left out: a few hundred bytes).
  scratch = std::max(scratch, ops::kCudaSumSquaresPartials * sizeof(double));
  return double(ops::kCudaGemmWorkspaceBytes + scratch);
}

RankMemory rank_memory(const Config& c, int stage, int tp_rank, const BackendTraits& be,
                       const PlannedSteps& plan) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const ModelPartition part = rank_partition(c, stage, tp_rank);
  const ParamLayout layout = param_layout(m, part);
  const double total = double(layout.total_floats());
  RankMemory r;
  r.stage = stage;
  r.tp_rank = tp_rank;
  for (const ParamEntry& e : layout.entries()) r.parameters += double(e.numel);
  r.gradients = 4 * total;
  if (p.sequence_parallel)  // the LayerNorm gradients, packed for their sum over tp
    for (const ParamEntry& e : layout.entries())
      if (e.layer_norm) r.gradients += 4 * double(e.numel);
  if (be.compute != DType::F32) r.weight_copy = total * double(dtype_size(be.compute));
  // The optimizer's ranges: under ZeRO-1 a block of every bucket (the buckets split the
  // padded arena evenly), with the master weights when the optimizer holds them.
  const double shard = zero_shards(p) ? total / replicas(p) : total;
  const bool master_sharded = optimizer_holds_master(p, be.compute);
  r.weights = master_sharded ? 0 : 4 * total;
  r.optimizer = (master_sharded ? 3 : 2) * 4 * shard;
  // A checkpoint gathers a sharded master bucket by bucket (each rank saves its own moments).
  if (master_sharded && !c.checkpoint.dir.empty()) {
    for (const GradBucket& b : plan_grad_buckets(layout, part, bucket_floats(p)))
      r.checkpoint_gather = std::max(r.checkpoint_gather, 4 * double(b.size()));
  }
  // The activation table at this rank's shapes, through this rank's steps. A set whose
  // sends were left to complete in the background counts until the step from which the
  // executor reuses it (sends_waitable_from), whatever the peers' timing.
  const ActivationShape shape = activation_shape(c, be);
  const ActivationPolicy policy = activation_policy(c);
  std::vector<ChunkActivationLayout> layouts;
  std::vector<bool> fused;
  for (const ChunkSpec& ch : part.chunks) {
    const int n = ch.layer_end - ch.layer_begin;
    layouts.push_back(chunk_activation_layout(shape, policy, n, ch.first, ch.last));
    fused.push_back(policy.fused_backward(n));
  }
  const std::vector<std::size_t> none;
  const ActivationPeaks peaks =
      activation_peaks(plan.steps[size_t(stage)], placement_of(c), stage, fused,
                       plan.reusable.empty() ? none : plan.reusable[size_t(stage)]);
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto& bytes = layouts[k].part_bytes;
    r.activations += double(peaks.sets[k]) * double(bytes[int(Lifetime::Set)]) +
                     double(peaks.until_b[k]) * double(bytes[int(Lifetime::UntilB)]) +
                     double(peaks.from_b[k]) * double(bytes[int(Lifetime::FromB)]);
    r.workspace = std::max(r.workspace, double(bytes[int(Lifetime::Workspace)]));
  }
  r.activations += double(peaks.boundaries) * double(layouts[0].part_bytes[int(Lifetime::Boundary)]);
  if (p.cp > 1)
    r.ring_buffers = double(RingAttention::buffer_bytes(shape.batch, shape.seq_len, shape.kv_heads,
                                                        head_size(m), be.compute));
  if (be.device_memory)
    r.backend_scratch = cuda_backend_scratch(
        c, be, std::any_of(part.chunks.begin(), part.chunks.end(), [](const ChunkSpec& ch) { return ch.first; }));
  return r;
}

// Tensor-parallel ranks hold equal shards (the vocabulary is padded to split evenly).
RankMemory heaviest_rank(const Config& c, const BackendTraits& be, const PlannedSteps& plan) {
  RankMemory heaviest;
  for (int stage = 0; stage < c.parallel.pp; ++stage) {
    const RankMemory r = rank_memory(c, stage, 0, be, plan);
    if (r.total() > heaviest.total()) heaviest = r;
  }
  return heaviest;
}

}  // namespace

BackendTraits backend_traits(const Config& c, bool cuda) {
  BackendTraits t;
  t.device_memory = cuda;
  t.compute = cuda && c.train.precision != Precision::FP32 ? DType::BF16 : DType::F32;
  t.logsumexp_attention =
      uses_fused_attention(c.train, cuda, c.parallel.cp) && (!cuda || t.compute == DType::BF16);
  return t;
}

RankMemory predict_peak_memory(const Config& c, const BackendTraits& be) {
  const auto steps = run_steps(c, be);
  return heaviest_rank(c, be, planned_steps(c, be, steps));
}

RankMemory predict_peak_memory(const Config& c, const BackendTraits& be,
                               const std::vector<std::vector<Step>>& steps) {
  return heaviest_rank(c, be, planned_steps(c, be, steps));
}

}  // namespace pptrain
