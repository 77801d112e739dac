// Where each virtual stage of the model lives: virtual stage k (0..pp*v-1, in model
// order) is chunk c of pipeline stage s. The one place that knows this rule; the
// partition, the schedules, the executor and the simulator all ask it.
//   looped: chunk c of stage s is virtual stage c*pp + s (Megatron's interleaving):
//           every chunk runs down the ranks, and the last stage wraps to the first.
//   v:      even chunks run down the ranks, odd chunks back up (c*pp + pp-1-s), so a
//           chunk boundary stays on one rank and the head sits on stage 0 (ZB-V).
#pragma once

namespace pptrain {

enum class PlacementKind { Looped, V };

struct ChunkLocation {
  int stage;
  int chunk;
  bool operator==(const ChunkLocation&) const = default;
};

class Placement {
 public:
  // std::invalid_argument if pp or virtual_stages < 1.
  Placement(PlacementKind kind, int pp, int virtual_stages);

  PlacementKind kind() const { return kind_; }
  int pp() const { return pp_; }
  int chunks() const { return v_; }               // chunks per stage
  int virtual_stages() const { return pp_ * v_; }  // in the whole pipeline

  int virtual_stage(int stage, int chunk) const;
  ChunkLocation locate(int virtual_stage) const;
  bool is_first(int stage, int chunk) const { return virtual_stage(stage, chunk) == 0; }
  bool is_last(int stage, int chunk) const {
    return virtual_stage(stage, chunk) == virtual_stages() - 1;
  }
  // The neighbours along the model; std::logic_error past either end.
  ChunkLocation next(int stage, int chunk) const;
  ChunkLocation previous(int stage, int chunk) const;
  // The stage holding the last virtual stage (the head and the loss).
  int head_stage() const { return locate(virtual_stages() - 1).stage; }

 private:
  PlacementKind kind_;
  int pp_, v_;
};

}  // namespace pptrain
