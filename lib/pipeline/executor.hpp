// Runs one rank's pipeline schedule (schedule.hpp) on the model: exactly the steps of
// build_steps, the ones the simulator proves: forwards, split backwards, local copies,
// and activation/gradient messages (blocking batches, or sends left to complete in the
// background, by the message mode). Activation sets are taken from a pool when a
// micro-batch enters a chunk and given back once its weight-gradient pass is done and
// its input gradient has left; a set whose sends were left in the background goes back
// at the step the plan gives (send_waits.hpp), so that what a rank allocates does not
// depend on its peers' timing and is what the memory plan predicts.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "model/param_layout.hpp"
#include "model/stage_model.hpp"
#include "pipeline/schedule.hpp"

namespace pptrain {

// Layer ranges [begin, end) of `parts` consecutive pieces of n_layer layers: the given
// counts, or an even split (the first n_layer % parts pieces one layer longer).
std::vector<std::pair<int, int>> split_layers(int n_layer, int parts,
                                              const std::vector<int>& counts = {});

// The chunks (the placement's virtual stages of `stage`) and tp shard a rank holds.
ModelPartition pipeline_partition(const ModelConfig& model, const Placement& placement, int stage,
                                  int tp_size, int tp_rank,
                                  const std::vector<int>& layers_per_stage = {});

// The channel of each kind of pipeline message (Transfer::channel, MessageMode::Channels).
inline constexpr int kActivationChannel = 0, kGradientChannel = 1;

// Every channel the executor's messages travel on (MessageMode::Channels), for the
// pipelines `pipelines` (world ranks by stage, each): from each stage to the stage of
// the next virtual stage, activations; back, gradients. In one order on every rank.
std::vector<comm::PipelineChannel> pipeline_channels(const Placement& placement,
                                                     const std::vector<std::vector<int>>& pipelines);

// Times of one step's schedule, from the backend's marks (ops::Ops::mark): device time
// on CUDA, host time on the CPU.
struct PipelineStats {
  double compute_s = 0;     // forward and backward passes (tensor-parallel all-reduces included)
  double forward_s = 0, backward_input_s = 0, backward_weight_s = 0;  // compute_s by kind
  double wait_s = 0;        // waiting for neighbours' messages
  double elapsed_s = 0;     // the whole schedule
  int peak_activations = 0; // most activation sets alive at once
};

class PipelineExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  // Fills tokens and targets [batch, seq_len] of micro-batch `mb`.
  using BatchFn = std::function<void(int mb, int32_t* tokens, int32_t* targets)>;
  // Called after each action with its timing (for traces).
  using ActionFn = std::function<void(const Action&, Clock::time_point, Clock::time_point)>;

  // `pp_ranks`: world ranks of this pipeline, by stage. `mode`: Grouped where a batch
  // holds the compute stream until it completes (NCCL on one stream), AsyncSends or
  // Channels where sends complete in the background (MPI; NCCL channels).
  PipelineExecutor(StageModel& model, comm::World& world, std::vector<int> pp_ranks,
                   ScheduleKind kind, int stage, int micro_batches, int virtual_stages,
                   MessageMode mode, const StageCosts& planned = {});
  // The same with the steps built (this stage's in steps[stage]; the others may be
  // empty) and, for steps whose sends complete in the background, this stage's
  // sends_waitable_from (else empty).
  PipelineExecutor(StageModel& model, comm::World& world, std::vector<int> pp_ranks,
                   const Placement& placement, std::vector<std::vector<Step>> steps, int stage,
                   int micro_batches, std::vector<std::size_t> reusable);

  // What a training step tells the gradient reduction; each may be empty.
  struct GradHooks {
    // Layer l's gradients are final: its last micro-batch's weight pass is queued.
    std::function<void(int layer)> layer_done;
    // Chunk c's gradients are final: its last weight-gradient pass is queued (and, for
    // the chunk holding the token embedding, that of a local head chunk sharing it).
    std::function<void(int chunk)> chunk_done;
    // Runs after every step of the schedule (host communication progresses there).
    std::function<void()> progress;
  };
  // Queues one training step's schedule with loss scale `loss_scale` per micro-batch;
  // on a device backend the host does not wait for it. A last stage adds each
  // micro-batch's mean loss to *loss_total (backend memory, fp64). Every weight
  // gradient is accumulated when it returns.
  void train_step(const BatchFn& batch, float loss_scale, double* loss_total,
                  const GradHooks& hooks = {});
  // The last train_step's times, from `marks` (the backend's take_marks(), read after
  // its wait_queue()); on_action, if set, gets each action's span, placed on the host
  // clock from the step's start.
  PipelineStats step_stats(const std::vector<double>& marks, const ActionFn& on_action = {}) const;
  // The most activation sets the last train_step held at once.
  int peak_activations() const { return peak_activations_; }
  // The host time at which the last train_step began: its device time zero.
  Clock::time_point step_started() const { return started_; }
  // The schedule's steps of every rank of the pipeline, by stage (this rank runs its own).
  const std::vector<std::vector<Step>>& all_steps() const { return all_steps_; }
  // Forward only through `count` micro-batches; returns the sum of their mean losses
  // on the last stage (0 elsewhere). `losses_out`, if set, receives per-position losses
  // of each micro-batch on the last stage (count * batch * seq_len).
  double evaluate(int count, const BatchFn& batch, std::vector<float>* losses_out = nullptr);
  // For a captured step (train.cuda_graph): every micro-batch's tokens and targets in
  // host memory the backend copies from when the queued copy runs (allocate_host), which
  // fill_batches() writes before each step and train_step then reads instead of asking
  // its `batch`.
  void keep_batches_in_host_memory();
  void fill_batches(const BatchFn& batch);

 private:
  using Key = std::pair<int, int>;  // (microbatch, chunk)
  StageModel::Set& acquire(const Key& key);
  void release(const Key& key);
  // Moves a draining set of `chunk` that the plan reuses by this step to the pool (its
  // boundary arrays back to the model), waiting for its sends if they are still leaving
  // (one whose sends are done first); none if there is no such set.
  void reuse_drained(int chunk);
  void drain();         // waits for every send still leaving
  void to_pool(int chunk, std::unique_ptr<StageModel::Set> acts);
  // The set of the chunk on this rank that a's message goes to; null when it leaves the rank.
  StageModel::Set* local_peer(const Action& a);
  int tag(int microbatch, int chunk, bool backward) const;
  comm::Transfer transfer(const Action& a);  // the message_part() of boundary(a)
  ops::Act* boundary(const Action& a);
  void communicate(const Step& step);
  void sent(const Action& a);  // after a SendBackward: release the set if W has run

  StageModel& model_;
  comm::World& world_;
  std::vector<int> pp_ranks_;
  Placement placement_;
  std::vector<std::vector<Step>> all_steps_;  // every rank's, by stage
  const std::vector<Step>& steps() const { return all_steps_[size_t(stage_)]; }
  int pp_, stage_, m_, v_;
  std::map<Key, std::unique_ptr<StageModel::Set>> live_;
  std::set<Key> weight_done_, gradient_sent_;  // a set is released once both hold
  // Sends in the background: the step from which the plan reuses a set whose sends were
  // posted in each step (sends_waitable_from), the step being run, the sends of each
  // live set and the step from which it is reused, and the released sets waiting for
  // that step.
  std::vector<std::size_t> reusable_;
  std::size_t step_ = 0;
  std::map<Key, std::vector<std::unique_ptr<comm::PendingOp>>> sends_;
  std::map<Key, std::size_t> reuse_from_;
  struct Draining {
    int chunk;
    std::size_t reusable_from;
    std::unique_ptr<StageModel::Set> acts;
    std::vector<std::unique_ptr<comm::PendingOp>> sends;
  };
  std::vector<Draining> draining_;
  std::vector<std::vector<std::unique_ptr<StageModel::Set>>> pool_;  // per chunk
  std::vector<int32_t> tokens_, targets_;
  std::unique_ptr<int32_t, ops::Ops::FreeHost> batches_;  // keep_batches_in_host_memory's
  // Micro-batch mb's arrays: in batches_ when kept there, else tokens_ and targets_.
  int32_t* tokens_of(int mb);
  int32_t* targets_of(int mb);
  // The last train_step: the index of its first mark (one more after each step, and
  // one after the final drain), the host time it was taken, the most sets it held.
  std::size_t first_mark_ = 0;
  Clock::time_point started_;
  int peak_activations_ = 0;
};

}  // namespace pptrain
