// The rank grid for tensor (tp), context (cp), data (dp) and pipeline (pp) parallelism: a
// pure mapping rank <-> (tp, cp, dp, pp) and the rank lists of every communicator group.
// No MPI here; lib/comm turns these lists into communicators.
#pragma once
#include <string>
#include <vector>

namespace pptrain {

struct RankCoord {
  int tp = 0, dp = 0, pp = 0, cp = 0;
  bool operator==(const RankCoord&) const = default;
};

// The degrees of the four kinds of parallelism.
struct GridSizes {
  int tp = 1, cp = 1, dp = 1, pp = 1;
};

// The rank grid in Megatron's order tp-cp-dp-pp: tp varies fastest, pp slowest,
// rank = tp + TP * (cp + CP * (dp + DP * pp)). A TP group is consecutive ranks (inside a
// node), and a context-parallel ring the next closest, since the ring moves the most
// bytes after the tensor-parallel collectives; data and pipeline parallelism, which move
// the fewest, span nodes.
class RankGrid {
 public:
  // `head_stage`: the pipeline stage holding the LM head (the last virtual stage); -1 for
  // the last stage. `tied_head`: the head is the token embedding, so the first and head
  // stages form embedding groups (an untied head needs none). std::invalid_argument if a
  // size is < 1, the world overflows int or head_stage is not a stage.
  RankGrid(GridSizes sizes, int head_stage = -1, bool tied_head = true);
  RankGrid(int tp, int dp, int pp, int head_stage = -1, bool tied_head = true)
      : RankGrid(GridSizes{tp, 1, dp, pp}, head_stage, tied_head) {}

  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int head_stage() const { return head_stage_; }
  int world_size() const { return tp_ * cp_ * dp_ * pp_; }
  // The ranks holding the same parameters as one rank: dp * cp of them.
  int replicas() const { return dp_ * cp_; }

  RankCoord coord(int rank) const;  // std::out_of_range if rank not in [0, world)
  int rank(RankCoord c) const;      // std::out_of_range if outside the grid
  // A rank's place among its replicas: cp + CP * dp, its index in replica_group.
  int replica(int rank) const;

  std::vector<int> tp_group(int rank) const;  // ranks sharing (cp, dp, pp), ordered by tp
  std::vector<int> cp_group(int rank) const;  // ranks sharing (tp, dp, pp), ordered by cp
  std::vector<int> dp_group(int rank) const;  // ranks sharing (tp, cp, pp), ordered by dp
  // Ranks sharing (tp, pp), which hold the same parameters: the group gradients are
  // reduced over (and ZeRO-1 shards over), dp * cp ranks ordered by replica().
  std::vector<int> replica_group(int rank) const;
  std::vector<int> pp_group(int rank) const;  // ranks sharing (tp, cp, dp), ordered by stage
  // Ranks holding the tied token embedding of this rank's pipeline: {first stage, head
  // stage} (one rank when they are the same stage). Empty for ranks on neither, and for
  // every rank when the head is untied.
  std::vector<int> embedding_group(int rank) const;

  // Every group of a kind, ordered by its lowest rank; the index of a group is the
  // MPI_Comm_split colour to use for it.
  std::vector<std::vector<int>> all_tp_groups() const;
  std::vector<std::vector<int>> all_cp_groups() const;
  std::vector<std::vector<int>> all_dp_groups() const;
  std::vector<std::vector<int>> all_replica_groups() const;
  std::vector<std::vector<int>> all_pp_groups() const;
  std::vector<std::vector<int>> all_embedding_groups() const;

  // Index of the group of each kind that contains `rank` (its colour).
  int tp_group_index(int rank) const;
  int cp_group_index(int rank) const;
  int dp_group_index(int rank) const;
  int replica_group_index(int rank) const;
  int pp_group_index(int rank) const;
  int embedding_group_index(int rank) const;  // -1 if the rank is in no embedding group

  // One line per rank (rank -> tp, cp, dp, pp), then every TP, CP, DP, replica, PP and
  // embedding group (CP and replica groups only when cp > 1).
  std::string describe() const;

 private:
  // The groups of all ranks sharing every coordinate but those `varying` sets, in order
  // of their lowest rank.
  template <typename GroupOf>
  std::vector<std::vector<int>> all_groups(GroupOf group_of) const;

  int tp_, cp_, dp_, pp_, head_stage_;
  bool tied_head_;
};

}  // namespace pptrain
