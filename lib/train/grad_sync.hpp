// Gradient reduction across ranks and the data-parallel optimizer shards. Without ZeRO
// each chunk's gradients are all-reduced over the dp group, with parallel.overlap as
// soon as the chunk's last weight-gradient pass is queued (overlapping the rest of the
// schedule: on GPUs on the NCCL side stream, on MPI progressed by progress()); with
// parallel.zero: 1 the gradients are reduce-scattered instead, each dp rank updates its
// shard of the arena, and the parameters are all-gathered back. The tied embedding's
// two copies (first and last pipeline stage) have their gradients summed, and so, under
// sequence parallelism, have the tp ranks' LayerNorm gradients. Arrays stay in
// the backend's memory; the communicators are the ones for the model's arrays.
#pragma once
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "optim/adamw.hpp"
#include "train/session.hpp"

namespace pptrain {

class GradSync {
 public:
  explicit GradSync(Session& s);

  // The arena range this rank's optimizer updates: everything, or its ZeRO shard.
  std::size_t begin() const { return begin_; }
  std::size_t end() const { return end_; }

  // Starts a step: zeroes its statistics.
  void start_step();
  // Where the executor adds the step's micro-batch losses (backend memory, fp64).
  double* loss_total() { return static_cast<double*>(stats_.get()); }
  // The chunk's gradients are final: with parallel.overlap its all-reduce starts now.
  void chunk_done(int chunk);
  // Lets the started reductions progress (MPI tests them; a device needs nothing).
  void progress();
  // Queues the rest of every reduction, the global loss and squared gradient norm (summed
  // over the tp, pp and dp groups for the model's arrays) and the update's control
  // (ops::Ops::update_control with `grad_clip`), then the copy of those to the host.
  void finish(double grad_clip);
  // The optimizer step over this rank's range, skipped on the backend when the step's
  // loss or norm is not finite, then (ZeRO) the all-gather of the updated shards; the
  // model's weight copy is refreshed either way.
  void update(AdamW& opt, float lr, int64_t t);
  // After the backend's wait_queue(): the step's loss summed over the data-parallel
  // ranks (each a sum of micro-batch means) and the global gradient norm.
  double loss_sum() const { return host_stats_.get()[0]; }
  double grad_norm() const;

  // Whole-arena moments for a checkpoint, in host memory (all-gathered over dp under ZeRO).
  void full_moments(AdamW& opt, float* m, float* v);
  // Puts whole-arena moments loaded from a checkpoint (host memory) into the optimizer's range.
  void load_moments(const float* m, const float* v, AdamW& opt);

 private:
  void start_reduction(int chunk);  // the chunk's all-reduce over dp (none under ZeRO)
  // full (backend memory, total_ floats) = every dp rank's shard.
  void all_gather_range(const float* shard, float* full);
  // Sequence parallelism: sums the LayerNorm gradients over tp, packed in one message.
  void sum_layer_norms_over_tp();

  Session& s_;
  bool zero_;
  std::size_t total_, shard_, begin_, end_;
  std::vector<std::pair<std::size_t, std::size_t>> chunk_ranges_;
  std::vector<const ParamEntry*> layer_norms_;  // under sequence parallelism
  ops::Buffer layer_norm_grads_;                // their gradients, packed
  std::vector<std::unique_ptr<comm::PendingOp>> buckets_;
  ops::Buffer padded_, shard_grads_;  // ZeRO only: shard_ * dp and shard_ floats
  // The step's {loss, squared norm} (fp64) and the update's control (2 floats), in
  // backend memory; the statistics' host copy (pinned on a device).
  ops::Buffer stats_, control_;
  struct FreeHost {
    ops::Ops* ops;
    void operator()(double* p) const noexcept { ops->free_host(p); }
  };
  std::unique_ptr<double, FreeHost> host_stats_;
};

}  // namespace pptrain
