// RankGrid: rank = tp + TP * (dp + DP * pp). Groups are built from coordinates, so
// every list comes out ordered by the coordinate that varies inside the group.
#include "topology/rank_grid.hpp"

#include <climits>
#include <sstream>
#include <stdexcept>

namespace pptrain {

RankGrid::RankGrid(int tp, int dp, int pp, int head_stage, bool tied_head)
    : tp_(tp), dp_(dp), pp_(pp), head_stage_(head_stage < 0 ? pp - 1 : head_stage),
      tied_head_(tied_head) {
  if (tp < 1 || dp < 1 || pp < 1)
    throw std::invalid_argument("rank grid: tp, dp and pp must be >= 1, got tp=" +
                                std::to_string(tp) + " dp=" + std::to_string(dp) +
                                " pp=" + std::to_string(pp));
  if (static_cast<long long>(tp) * dp * pp > INT_MAX)
    throw std::invalid_argument("rank grid: tp*dp*pp is too large");
  if (head_stage_ >= pp)
    throw std::invalid_argument("rank grid: head stage " + std::to_string(head_stage) +
                                " is not a stage of pp=" + std::to_string(pp));
}

RankCoord RankGrid::coord(int rank) const {
  if (rank < 0 || rank >= world_size())
    throw std::out_of_range("rank grid: rank " + std::to_string(rank) +
                            " is outside [0, " + std::to_string(world_size()) + ")");
  return {rank % tp_, (rank / tp_) % dp_, rank / (tp_ * dp_)};
}

int RankGrid::rank(RankCoord c) const {
  if (c.tp < 0 || c.tp >= tp_ || c.dp < 0 || c.dp >= dp_ || c.pp < 0 || c.pp >= pp_)
    throw std::out_of_range("rank grid: coordinate (tp=" + std::to_string(c.tp) +
                            ", dp=" + std::to_string(c.dp) + ", pp=" + std::to_string(c.pp) +
                            ") is outside the grid");
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

std::vector<int> RankGrid::tp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> g;
  for (c.tp = 0; c.tp < tp_; ++c.tp) g.push_back(rank(c));
  return g;
}

std::vector<int> RankGrid::dp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> g;
  for (c.dp = 0; c.dp < dp_; ++c.dp) g.push_back(rank(c));
  return g;
}

std::vector<int> RankGrid::pp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> g;
  for (c.pp = 0; c.pp < pp_; ++c.pp) g.push_back(rank(c));
  return g;
}

std::vector<int> RankGrid::embedding_group(int r) const {
  RankCoord c = coord(r);
  if (!tied_head_ || (c.pp != 0 && c.pp != head_stage_)) return {};
  RankCoord first = c, head = c;
  first.pp = 0;
  head.pp = head_stage_;
  if (head_stage_ == 0) return {rank(first)};
  return {rank(first), rank(head)};
}

// Group indices: the lowest rank of a group fixes the varying coordinate at 0, and the
// remaining two coordinates, slowest last, number the groups in order of that rank.
int RankGrid::tp_group_index(int r) const {
  RankCoord c = coord(r);
  return c.dp + dp_ * c.pp;
}

int RankGrid::dp_group_index(int r) const {
  RankCoord c = coord(r);
  return c.tp + tp_ * c.pp;
}

int RankGrid::pp_group_index(int r) const {
  RankCoord c = coord(r);
  return c.tp + tp_ * c.dp;
}

int RankGrid::embedding_group_index(int r) const {
  RankCoord c = coord(r);
  if (!tied_head_ || (c.pp != 0 && c.pp != head_stage_)) return -1;
  return pp_group_index(r);
}

// Each all_*_groups lists the group of every group-leading rank (varying coordinate 0).
std::vector<std::vector<int>> RankGrid::all_tp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < dp_; ++d) out.push_back(tp_group(rank({0, d, p})));
  return out;
}

std::vector<std::vector<int>> RankGrid::all_dp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int t = 0; t < tp_; ++t) out.push_back(dp_group(rank({t, 0, p})));
  return out;
}

std::vector<std::vector<int>> RankGrid::all_pp_groups() const {
  std::vector<std::vector<int>> out;
  for (int d = 0; d < dp_; ++d)
    for (int t = 0; t < tp_; ++t) out.push_back(pp_group(rank({t, d, 0})));
  return out;
}

std::vector<std::vector<int>> RankGrid::all_embedding_groups() const {
  std::vector<std::vector<int>> out;
  if (!tied_head_) return out;
  for (int d = 0; d < dp_; ++d)
    for (int t = 0; t < tp_; ++t) out.push_back(embedding_group(rank({t, d, 0})));
  return out;
}

namespace {

void describe_groups(std::ostringstream& os, const char* kind,
                     const std::vector<std::vector<int>>& groups) {
  for (size_t i = 0; i < groups.size(); ++i) {
    os << kind << " group " << i << ":";
    for (int r : groups[i]) os << ' ' << r;
    os << '\n';
  }
}

}  // namespace

std::string RankGrid::describe() const {
  std::ostringstream os;
  os << "rank grid tp=" << tp_ << " dp=" << dp_ << " pp=" << pp_ << " (world "
     << world_size() << ", order tp-dp-pp)\n";
  for (int r = 0; r < world_size(); ++r) {
    RankCoord c = coord(r);
    os << "rank " << r << ": tp=" << c.tp << " dp=" << c.dp << " pp=" << c.pp << '\n';
  }
  describe_groups(os, "tp", all_tp_groups());
  describe_groups(os, "dp", all_dp_groups());
  describe_groups(os, "pp", all_pp_groups());
  describe_groups(os, "embedding", all_embedding_groups());
  return os.str();
}

}  // namespace pptrain
