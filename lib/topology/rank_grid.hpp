// The rank grid for tensor (tp), data (dp) and pipeline (pp) parallelism: a pure
// mapping rank <-> (tp, dp, pp) and the rank lists of every communicator group.
// No MPI here; lib/comm turns these lists into communicators.
#pragma once
#include <string>
#include <vector>

namespace pptrain {

struct RankCoord {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const RankCoord&) const = default;
};

// The rank grid in Megatron's default order tp-dp-pp: tp varies fastest, pp slowest,
// rank = tp + TP * (dp + DP * pp), so a TP group is consecutive ranks (inside a node).
class RankGrid {
 public:
  // `head_stage`: the pipeline stage holding the LM head (the last virtual stage); -1 for
  // the last stage. `tied_head`: the head is the token embedding, so the first and head
  // stages form embedding groups (an untied head needs none). std::invalid_argument if a
  // size is < 1, the world overflows int or head_stage is not a stage.
  RankGrid(int tp, int dp, int pp, int head_stage = -1, bool tied_head = true);

  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int head_stage() const { return head_stage_; }
  int world_size() const { return tp_ * dp_ * pp_; }

  RankCoord coord(int rank) const;  // std::out_of_range if rank not in [0, world)
  int rank(RankCoord c) const;      // std::out_of_range if outside the grid

  std::vector<int> tp_group(int rank) const;  // ranks sharing (dp, pp), ordered by tp
  std::vector<int> dp_group(int rank) const;  // ranks sharing (tp, pp), ordered by dp
  std::vector<int> pp_group(int rank) const;  // ranks sharing (tp, dp), ordered by stage
  // Ranks holding the tied token embedding of this rank's pipeline: {first stage, head
  // stage} (one rank when they are the same stage). Empty for ranks on neither, and for
  // every rank when the head is untied.
  std::vector<int> embedding_group(int rank) const;

  // Every group of a kind, ordered by its lowest rank; the index of a group is the
  // MPI_Comm_split colour to use for it.
  std::vector<std::vector<int>> all_tp_groups() const;
  std::vector<std::vector<int>> all_dp_groups() const;
  std::vector<std::vector<int>> all_pp_groups() const;
  std::vector<std::vector<int>> all_embedding_groups() const;

  // Index of the group of each kind that contains `rank` (its colour).
  int tp_group_index(int rank) const;
  int dp_group_index(int rank) const;
  int pp_group_index(int rank) const;
  int embedding_group_index(int rank) const;  // -1 if the rank is in no embedding group

  // One line per rank (rank -> tp, dp, pp), then every TP, DP, PP and embedding group.
  std::string describe() const;

 private:
  int tp_, dp_, pp_, head_stage_;
  bool tied_head_;
};

}  // namespace pptrain
