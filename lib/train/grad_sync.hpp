// Gradient reduction across ranks and the data-parallel optimizer shards. Without ZeRO
// each chunk's gradients are all-reduced over the dp group as soon as the chunk's last
// weight-gradient pass is done (overlapping the rest of the schedule); with
// parallel.zero: 1 the gradients are reduce-scattered instead, each dp rank updates its
// shard of the arena, and the parameters are all-gathered back. The tied embedding's
// two copies (first and last pipeline stage) have their gradients summed.
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

  void start_step() { buckets_.clear(); }
  void chunk_done(int chunk);  // the chunk's gradients are final
  // Completes every reduction; returns the global gradient norm.
  double finish();
  // After the optimizer step: all-gathers the updated shards (ZeRO only).
  void share_parameters();

  // Whole-arena moments for a checkpoint (all-gathered over dp under ZeRO).
  void full_moments(const AdamW& opt, float* m, float* v);
  // Puts whole-arena moments loaded from a checkpoint into the optimizer's range.
  void load_moments(const float* m, const float* v, AdamW& opt);

 private:
  void all_gather_range(const float* shard, float* full);

  Session& s_;
  bool zero_;
  std::size_t total_, shard_, begin_, end_;
  std::vector<std::pair<std::size_t, std::size_t>> chunk_ranges_;
  std::vector<std::unique_ptr<comm::PendingOp>> buckets_;
  std::vector<float> padded_, shard_grads_;
};

}  // namespace pptrain
