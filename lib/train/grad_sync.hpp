// Gradient reduction across ranks and the data-parallel optimizer shards. The gradient
// arena is cut into buckets (grad_buckets.hpp). Without ZeRO each bucket is all-reduced
// over the dp group; with parallel.zero: 1 it is reduce-scattered in place instead, each
// dp rank updates its block of every bucket, and the parameters are all-gathered back
// bucket by bucket. With parallel.overlap a bucket's reduction starts as soon as its
// last gradient of the step is queued (on GPUs on the NCCL side stream; on MPI it
// progresses through progress()), and each all-gather as soon as its block is updated.
// The tied embedding's two copies (first and last pipeline stage) have their gradients
// summed, and so, under sequence parallelism, have the tp ranks' LayerNorm gradients.
// Arrays stay in the backend's memory; the communicators are the ones for the model's
// arrays.
#pragma once
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "optim/adamw.hpp"
#include "train/grad_buckets.hpp"
#include "train/session.hpp"

namespace pptrain {

class GradSync {
 public:
  explicit GradSync(Session& s);

  // The arena ranges this rank's optimizer updates: the whole arena, or under ZeRO its
  // block of every bucket (in bucket order).
  const std::vector<AdamW::Range>& ranges() const { return owned_; }

  // Where the executor adds the step's micro-batch losses (backend memory, fp64; zero
  // at the start of every step).
  double* loss_total() { return static_cast<double*>(stats_.get()); }
  // What the executor calls during the step: with parallel.overlap each bucket's
  // reduction starts once its layer, or its chunk, is done; progress() lets started
  // reductions progress (MPI tests them; a device needs nothing).
  PipelineExecutor::GradHooks hooks();
  // Queues the rest of every reduction, the global loss and squared gradient norm (summed
  // over the tp, pp and dp groups for the model's arrays) and the update's control
  // (ops::Ops::update_control with `grad_clip`), then the copy of those to the host.
  void finish(double grad_clip);
  // The optimizer step over this rank's ranges, skipped on the backend when the step's
  // loss or norm is not finite, then (ZeRO) the all-gather of the updated blocks of the
  // parameters, or of the weight copy when the optimizer holds the master
  // (optimizer_holds_master): 2 bytes a parameter on a GPU. The model's weight copy is up
  // to date either way.
  void update(AdamW& opt, float lr, int64_t t);
  // After the backend's wait_queue(): the step's loss summed over the data-parallel
  // ranks (each a sum of micro-batch means) and the global gradient norm.
  double loss_sum() const { return host_stats_.get()[0]; }
  double grad_norm() const;

  // This rank's fp32 master weights in backend memory: the model's arena, or the
  // optimizer's blocks.
  ops::Span master(AdamW& opt);
  // The fp32 master weights as a whole arena in host memory: the model's, or the
  // optimizer's blocks all-gathered over dp bucket by bucket (collective then).
  void read_params(AdamW& opt, float* host);
  // Sets the master weights, and the weight copy, from a whole arena in host memory.
  void write_params(AdamW& opt, const float* host);
  // Puts whole-arena moments loaded from a checkpoint (host memory) into the optimizer's ranges.
  void load_moments(const float* m, const float* v, AdamW& opt);

 private:
  void layer_done(int layer);
  void chunk_done(int chunk);
  void progress();
  void start(std::size_t bucket);  // its all-reduce, or reduce-scatter, over dp
  void wait_started();             // the compute stream waits for every started one
  // All-gathers bucket i's blocks of `arena` (backend memory, the arena's elements in
  // `dt`), or every bucket's, waited for in the compute queue.
  std::unique_ptr<comm::PendingOp> gather_block(std::size_t i, void* arena, DType dt);
  void all_gather_blocks(void* arena, DType dt);
  // The whole arena of `packed` (one of the optimizer's arrays, its ranges packed) in
  // host memory under ZeRO-1: the dp ranks' blocks gathered through one bucket's buffer.
  void download_whole(AdamW& opt, const float* packed, float* host);
  // Sequence parallelism: sums the LayerNorm gradients over tp, packed in one message.
  void sum_layer_norms_over_tp();

  Session& s_;
  bool zero_, overlap_;
  int dp_;  // the replicas (dp * cp) whose gradients are summed
  std::vector<GradBucket> buckets_;
  // ZeRO with the embedding tied across stages: the buckets holding wte reduce only after
  // the copies are summed (the stages' blocks differ).
  std::vector<bool> after_embedding_;
  std::vector<AdamW::Range> owned_;
  std::vector<std::unique_ptr<comm::PendingOp>> pending_;  // by bucket: started this step
  std::vector<AdamW::Range> layer_norms_;  // under sequence parallelism: the owned parts
  ops::Buffer layer_norm_grads_;           // their gradients, packed
  // The step's {loss, squared norm} (fp64) and the update's control (2 floats), in
  // backend memory; the statistics' host copy (pinned on a device).
  ops::Buffer stats_, control_;
  std::unique_ptr<double, ops::Ops::FreeHost> host_stats_;
};

}  // namespace pptrain
