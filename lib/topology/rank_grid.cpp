// RankGrid: rank = tp + TP * (cp + CP * (dp + DP * pp)). Groups are built from
// coordinates, so every list comes out ordered by the coordinate that varies inside it.
#include "topology/rank_grid.hpp"

#include <climits>
#include <sstream>
#include <stdexcept>

namespace pptrain {

RankGrid::RankGrid(GridSizes s, int head_stage, bool tied_head)
    : tp_(s.tp), cp_(s.cp), dp_(s.dp), pp_(s.pp),
      head_stage_(head_stage < 0 ? s.pp - 1 : head_stage), tied_head_(tied_head) {
  if (s.tp < 1 || s.cp < 1 || s.dp < 1 || s.pp < 1)
    throw std::invalid_argument("rank grid: tp, cp, dp and pp must be >= 1, got tp=" +
                                std::to_string(s.tp) + " cp=" + std::to_string(s.cp) +
                                " dp=" + std::to_string(s.dp) + " pp=" + std::to_string(s.pp));
  if (static_cast<long long>(s.tp) * s.cp * s.dp * s.pp > INT_MAX)
    throw std::invalid_argument("rank grid: tp*cp*dp*pp is too large");
  if (head_stage_ >= pp_)
    throw std::invalid_argument("rank grid: head stage " + std::to_string(head_stage) +
                                " is not a stage of pp=" + std::to_string(pp_));
}

RankCoord RankGrid::coord(int rank) const {
  if (rank < 0 || rank >= world_size())
    throw std::out_of_range("rank grid: rank " + std::to_string(rank) +
                            " is outside [0, " + std::to_string(world_size()) + ")");
  RankCoord c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  c.dp = (rank / (tp_ * cp_)) % dp_;
  c.pp = rank / (tp_ * cp_ * dp_);
  return c;
}

int RankGrid::rank(RankCoord c) const {
  if (c.tp < 0 || c.tp >= tp_ || c.cp < 0 || c.cp >= cp_ || c.dp < 0 || c.dp >= dp_ ||
      c.pp < 0 || c.pp >= pp_)
    throw std::out_of_range("rank grid: coordinate (tp=" + std::to_string(c.tp) +
                            ", cp=" + std::to_string(c.cp) + ", dp=" + std::to_string(c.dp) +
                            ", pp=" + std::to_string(c.pp) + ") is outside the grid");
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

int RankGrid::replica(int r) const {
  const RankCoord c = coord(r);
  return c.cp + cp_ * c.dp;
}

std::vector<int> RankGrid::tp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> g;
  for (c.tp = 0; c.tp < tp_; ++c.tp) g.push_back(rank(c));
  return g;
}

std::vector<int> RankGrid::cp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> g;
  for (c.cp = 0; c.cp < cp_; ++c.cp) g.push_back(rank(c));
  return g;
}

std::vector<int> RankGrid::dp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> g;
  for (c.dp = 0; c.dp < dp_; ++c.dp) g.push_back(rank(c));
  return g;
}

std::vector<int> RankGrid::replica_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> g;
  for (c.dp = 0; c.dp < dp_; ++c.dp)
    for (c.cp = 0; c.cp < cp_; ++c.cp) g.push_back(rank(c));
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

// Group indices: a group's lowest rank has its varying coordinates at 0; numbering the
// groups by the remaining coordinates, slowest last, orders them by that rank.
int RankGrid::tp_group_index(int r) const {
  RankCoord c = coord(r);
  return c.cp + cp_ * (c.dp + dp_ * c.pp);
}

int RankGrid::cp_group_index(int r) const {
  RankCoord c = coord(r);
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

int RankGrid::dp_group_index(int r) const {
  RankCoord c = coord(r);
  return c.tp + tp_ * (c.cp + cp_ * c.pp);
}

int RankGrid::replica_group_index(int r) const {
  RankCoord c = coord(r);
  return c.tp + tp_ * c.pp;
}

int RankGrid::pp_group_index(int r) const {
  RankCoord c = coord(r);
  return c.tp + tp_ * (c.cp + cp_ * c.dp);
}

int RankGrid::embedding_group_index(int r) const {
  RankCoord c = coord(r);
  if (!tied_head_ || (c.pp != 0 && c.pp != head_stage_)) return -1;
  return pp_group_index(r);
}

// A rank leads its group when it is the group's first (lowest) member.
template <typename GroupOf>
std::vector<std::vector<int>> RankGrid::all_groups(GroupOf group_of) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size(); ++r) {
    std::vector<int> g = (this->*group_of)(r);
    if (!g.empty() && g.front() == r) out.push_back(std::move(g));
  }
  return out;
}

std::vector<std::vector<int>> RankGrid::all_tp_groups() const { return all_groups(&RankGrid::tp_group); }
std::vector<std::vector<int>> RankGrid::all_cp_groups() const { return all_groups(&RankGrid::cp_group); }
std::vector<std::vector<int>> RankGrid::all_dp_groups() const { return all_groups(&RankGrid::dp_group); }
std::vector<std::vector<int>> RankGrid::all_replica_groups() const {
  return all_groups(&RankGrid::replica_group);
}
std::vector<std::vector<int>> RankGrid::all_pp_groups() const { return all_groups(&RankGrid::pp_group); }
std::vector<std::vector<int>> RankGrid::all_embedding_groups() const {
  return all_groups(&RankGrid::embedding_group);
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
  const bool context = cp_ > 1;
  os << "rank grid tp=" << tp_;
  if (context) os << " cp=" << cp_;
  os << " dp=" << dp_ << " pp=" << pp_ << " (world " << world_size() << ", order "
     << (context ? "tp-cp-dp-pp" : "tp-dp-pp") << ")\n";
  for (int r = 0; r < world_size(); ++r) {
    RankCoord c = coord(r);
    os << "rank " << r << ": tp=" << c.tp;
    if (context) os << " cp=" << c.cp;
    os << " dp=" << c.dp << " pp=" << c.pp << '\n';
  }
  describe_groups(os, "tp", all_tp_groups());
  if (context) describe_groups(os, "cp", all_cp_groups());
  describe_groups(os, "dp", all_dp_groups());
  if (context) describe_groups(os, "gradient (dp x cp)", all_replica_groups());
  describe_groups(os, "pp", all_pp_groups());
  describe_groups(os, "embedding", all_embedding_groups());
  return os.str();
}

}  // namespace pptrain
