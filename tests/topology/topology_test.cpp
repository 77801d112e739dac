// Tests for RankGrid: hand-written golden tables for small shapes, round trips and
// group partitions for many shapes, embedding groups, errors and describe() text.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "topology/rank_grid.hpp"

namespace pptrain {
namespace {

using Groups = std::vector<std::vector<int>>;

// A grid written out by hand: coords[r] for every rank and every group of each kind.
struct Golden {
  int tp, dp, pp;
  std::vector<RankCoord> coords;
  Groups tp_groups, dp_groups, pp_groups, embedding_groups;
};

std::vector<Golden> goldens() {
  return {
      {2, 2, 2,
       {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
      {1, 1, 1, {{0, 0, 0}}, {{0}}, {{0}}, {{0}}, {{0}}},
      {4, 1, 2,
       {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {0, 0, 1}, {1, 0, 1}, {2, 0, 1}, {3, 0, 1}},
       {{0, 1, 2, 3}, {4, 5, 6, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
      {1, 4, 1,
       {{0, 0, 0}, {0, 1, 0}, {0, 2, 0}, {0, 3, 0}},
       {{0}, {1}, {2}, {3}},
       {{0, 1, 2, 3}},
       {{0}, {1}, {2}, {3}},
       {{0}, {1}, {2}, {3}}},
      {2, 1, 4,
       {{0, 0, 0}, {1, 0, 0}, {0, 0, 1}, {1, 0, 1}, {0, 0, 2}, {1, 0, 2}, {0, 0, 3}, {1, 0, 3}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 2, 4, 6}, {1, 3, 5, 7}},
       {{0, 6}, {1, 7}}},
      {1, 2, 1,
       {{0, 0, 0}, {0, 1, 0}},
       {{0}, {1}},
       {{0, 1}},
       {{0}, {1}},
       {{0}, {1}}},
  };
}

std::string shape(int tp, int dp, int pp) {
  return "tp=" + std::to_string(tp) + " dp=" + std::to_string(dp) + " pp=" + std::to_string(pp);
}

TEST(RankGrid, GoldenTables) {
  for (const Golden& g : goldens()) {
    SCOPED_TRACE(shape(g.tp, g.dp, g.pp));
    RankGrid grid(g.tp, g.dp, g.pp);
    ASSERT_EQ(grid.world_size(), static_cast<int>(g.coords.size()));
    EXPECT_EQ(grid.all_tp_groups(), g.tp_groups);
    EXPECT_EQ(grid.all_dp_groups(), g.dp_groups);
    EXPECT_EQ(grid.all_pp_groups(), g.pp_groups);
    EXPECT_EQ(grid.all_embedding_groups(), g.embedding_groups);
    for (int r = 0; r < grid.world_size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(grid.coord(r), g.coords[r]);
      EXPECT_EQ(grid.rank(g.coords[r]), r);
      // Each rank's group is the golden group at its colour.
      EXPECT_EQ(grid.tp_group(r), g.tp_groups.at(grid.tp_group_index(r)));
      EXPECT_EQ(grid.dp_group(r), g.dp_groups.at(grid.dp_group_index(r)));
      EXPECT_EQ(grid.pp_group(r), g.pp_groups.at(grid.pp_group_index(r)));
    }
  }
}

TEST(RankGrid, GoldenGroupIndicesFor222) {
  RankGrid grid(2, 2, 2);
  const std::vector<int> tp_index = {0, 0, 1, 1, 2, 2, 3, 3};
  const std::vector<int> dp_index = {0, 1, 0, 1, 2, 3, 2, 3};
  const std::vector<int> pp_index = {0, 1, 2, 3, 0, 1, 2, 3};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(grid.tp_group_index(r), tp_index[r]) << "rank " << r;
    EXPECT_EQ(grid.dp_group_index(r), dp_index[r]) << "rank " << r;
    EXPECT_EQ(grid.pp_group_index(r), pp_index[r]) << "rank " << r;
    EXPECT_EQ(grid.embedding_group_index(r), pp_index[r]) << "rank " << r;
  }
}

// ZB-V's V placement puts the head on stage 0: the embedding group is that one rank,
// and the other stages are in none.
TEST(RankGrid, HeadOnTheFirstStage) {
  RankGrid grid(1, 2, 3, /*head_stage=*/0);
  EXPECT_EQ(grid.embedding_group(0), std::vector<int>{0});
  EXPECT_EQ(grid.embedding_group(1), std::vector<int>{1});
  EXPECT_TRUE(grid.embedding_group(4).empty());  // stage 2, not the head's stage
  EXPECT_EQ(grid.embedding_group_index(4), -1);
  EXPECT_EQ(grid.all_embedding_groups(), (std::vector<std::vector<int>>{{0}, {1}}));
  EXPECT_EQ(RankGrid(1, 1, 3, 1).embedding_group(1), (std::vector<int>{0, 1}));
  EXPECT_THROW(RankGrid(1, 1, 3, 3), std::invalid_argument);
}

// Shapes for the property tests, including non-powers of two.
std::vector<RankGrid> many_grids() {
  std::vector<RankGrid> out;
  for (int tp : {1, 2, 3, 4, 8})
    for (int dp : {1, 2, 3, 5})
      for (int pp : {1, 2, 3, 4}) out.emplace_back(tp, dp, pp);
  return out;
}

TEST(RankGrid, RoundTripAndTpFastestOrder) {
  for (const RankGrid& grid : many_grids()) {
    SCOPED_TRACE(shape(grid.tp(), grid.dp(), grid.pp()));
    EXPECT_EQ(grid.world_size(), grid.tp() * grid.dp() * grid.pp());
    int expected = 0;  // walking pp, dp, tp (slowest to fastest) visits ranks 0, 1, 2, ...
    for (int p = 0; p < grid.pp(); ++p)
      for (int d = 0; d < grid.dp(); ++d)
        for (int t = 0; t < grid.tp(); ++t) {
          RankCoord c{t, d, p};
          ASSERT_EQ(grid.rank(c), expected);
          ASSERT_EQ(grid.coord(expected), c);
          ++expected;
        }
  }
}

// Every rank is in exactly one group of the kind, that group sits at its colour, and
// the rank's own group list equals it.
void check_partition(const RankGrid& grid, const Groups& groups, size_t group_size,
                     int (RankGrid::*index)(int) const,
                     std::vector<int> (RankGrid::*group)(int) const) {
  std::vector<int> seen(grid.world_size(), 0);
  for (const auto& g : groups) {
    EXPECT_EQ(g.size(), group_size);
    for (int r : g) ++seen.at(r);
  }
  EXPECT_EQ(groups.size() * group_size, static_cast<size_t>(grid.world_size()));
  for (int r = 0; r < grid.world_size(); ++r) {
    EXPECT_EQ(seen[r], 1) << "rank " << r;
    EXPECT_EQ((grid.*group)(r), groups.at((grid.*index)(r))) << "rank " << r;
  }
}

TEST(RankGrid, GroupsPartitionTheRanks) {
  for (const RankGrid& grid : many_grids()) {
    SCOPED_TRACE(shape(grid.tp(), grid.dp(), grid.pp()));
    check_partition(grid, grid.all_tp_groups(), grid.tp(), &RankGrid::tp_group_index,
                    &RankGrid::tp_group);
    check_partition(grid, grid.all_dp_groups(), grid.dp(), &RankGrid::dp_group_index,
                    &RankGrid::dp_group);
    check_partition(grid, grid.all_pp_groups(), grid.pp(), &RankGrid::pp_group_index,
                    &RankGrid::pp_group);
    // A TP group is consecutive ranks.
    for (const auto& g : grid.all_tp_groups())
      for (size_t i = 1; i < g.size(); ++i) EXPECT_EQ(g[i], g[i - 1] + 1);
  }
}

TEST(RankGrid, EmbeddingGroups) {
  // pp == 1: every rank holds its own embedding, alone.
  RankGrid one(2, 2, 1);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(one.embedding_group(r), std::vector<int>{r});
    EXPECT_EQ(one.embedding_group_index(r), r);
  }
  // pp == 2: first and last stage are every rank.
  RankGrid two(1, 2, 2);
  EXPECT_EQ(two.all_embedding_groups(), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(two.embedding_group(3), (std::vector<int>{1, 3}));
  EXPECT_EQ(two.embedding_group_index(2), 0);
  // pp == 4: middle stages hold none.
  RankGrid four(1, 2, 4);  // rank = dp + 2 * pp
  EXPECT_EQ(four.all_embedding_groups(), (Groups{{0, 6}, {1, 7}}));
  EXPECT_EQ(four.embedding_group(0), (std::vector<int>{0, 6}));
  EXPECT_EQ(four.embedding_group(7), (std::vector<int>{1, 7}));
  for (int r : {2, 3, 4, 5}) {
    EXPECT_TRUE(four.embedding_group(r).empty()) << "rank " << r;
    EXPECT_EQ(four.embedding_group_index(r), -1) << "rank " << r;
  }
  EXPECT_EQ(four.embedding_group_index(6), 0);
  EXPECT_EQ(four.embedding_group_index(1), 1);
}

TEST(RankGrid, Errors) {
  EXPECT_THROW(RankGrid(0, 1, 1), std::invalid_argument);
  EXPECT_THROW(RankGrid(1, 0, 1), std::invalid_argument);
  EXPECT_THROW(RankGrid(1, 1, -2), std::invalid_argument);
  EXPECT_THROW(RankGrid(65536, 65536, 1), std::invalid_argument);
  RankGrid grid(2, 2, 2);
  EXPECT_THROW(grid.coord(-1), std::out_of_range);
  EXPECT_THROW(grid.coord(8), std::out_of_range);
  EXPECT_THROW(grid.tp_group(8), std::out_of_range);
  EXPECT_THROW(grid.embedding_group_index(-1), std::out_of_range);
  EXPECT_THROW(grid.rank({2, 0, 0}), std::out_of_range);
  EXPECT_THROW(grid.rank({0, -1, 0}), std::out_of_range);
  EXPECT_THROW(grid.rank({0, 0, 2}), std::out_of_range);
}

TEST(RankGrid, DescribeGolden) {
  const std::string expected =
      "rank grid tp=2 dp=2 pp=2 (world 8, order tp-dp-pp)\n"
      "rank 0: tp=0 dp=0 pp=0\n"
      "rank 1: tp=1 dp=0 pp=0\n"
      "rank 2: tp=0 dp=1 pp=0\n"
      "rank 3: tp=1 dp=1 pp=0\n"
      "rank 4: tp=0 dp=0 pp=1\n"
      "rank 5: tp=1 dp=0 pp=1\n"
      "rank 6: tp=0 dp=1 pp=1\n"
      "rank 7: tp=1 dp=1 pp=1\n"
      "tp group 0: 0 1\n"
      "tp group 1: 2 3\n"
      "tp group 2: 4 5\n"
      "tp group 3: 6 7\n"
      "dp group 0: 0 2\n"
      "dp group 1: 1 3\n"
      "dp group 2: 4 6\n"
      "dp group 3: 5 7\n"
      "pp group 0: 0 4\n"
      "pp group 1: 1 5\n"
      "pp group 2: 2 6\n"
      "pp group 3: 3 7\n"
      "embedding group 0: 0 4\n"
      "embedding group 1: 1 5\n"
      "embedding group 2: 2 6\n"
      "embedding group 3: 3 7\n";
  EXPECT_EQ(RankGrid(2, 2, 2).describe(), expected);
}

// Context parallelism: tp-cp-dp-pp, by hand for tp2 cp2 pp2 and cp2 dp2.
TEST(RankGrid, ContextParallelGolden) {
  const RankGrid a(GridSizes{2, 2, 1, 2});  // rank = tp + 2 cp + 4 pp
  EXPECT_EQ(a.world_size(), 8);
  EXPECT_EQ(a.coord(6), (RankCoord{0, 0, 1, 1}));
  EXPECT_EQ(a.rank(RankCoord{1, 0, 0, 1}), 3);
  EXPECT_EQ(a.all_tp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(a.all_cp_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(a.all_dp_groups(), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(a.all_replica_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(a.all_pp_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(a.all_embedding_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const RankGrid b(GridSizes{1, 2, 2, 1});  // rank = cp + 2 dp
  EXPECT_EQ(b.all_cp_groups(), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(b.all_dp_groups(), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(b.all_replica_groups(), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(b.replicas(), 4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(b.replica(r), r);
  EXPECT_THROW(RankGrid(GridSizes{1, 0, 1, 1}), std::invalid_argument);
}

TEST(RankGrid, ContextParallelPartitions) {
  for (int tp : {1, 2, 3})
    for (int cp : {1, 2, 4})
      for (int dp : {1, 3})
        for (int pp : {1, 2}) {
          const RankGrid grid(GridSizes{tp, cp, dp, pp});
          SCOPED_TRACE(shape(tp, dp, pp) + " cp=" + std::to_string(cp));
          int expected = 0;
          for (int p = 0; p < pp; ++p)
            for (int d = 0; d < dp; ++d)
              for (int c = 0; c < cp; ++c)
                for (int t = 0; t < tp; ++t) {
                  const RankCoord rc{t, d, p, c};
                  ASSERT_EQ(grid.rank(rc), expected);
                  ASSERT_EQ(grid.coord(expected), rc);
                  ++expected;
                }
          check_partition(grid, grid.all_tp_groups(), tp, &RankGrid::tp_group_index,
                          &RankGrid::tp_group);
          check_partition(grid, grid.all_cp_groups(), cp, &RankGrid::cp_group_index,
                          &RankGrid::cp_group);
          check_partition(grid, grid.all_dp_groups(), dp, &RankGrid::dp_group_index,
                          &RankGrid::dp_group);
          check_partition(grid, grid.all_replica_groups(), cp * dp,
                          &RankGrid::replica_group_index, &RankGrid::replica_group);
          check_partition(grid, grid.all_pp_groups(), pp, &RankGrid::pp_group_index,
                          &RankGrid::pp_group);
          for (int r = 0; r < grid.world_size(); ++r)
            EXPECT_EQ(grid.replica_group(r).at(grid.replica(r)), r);
        }
}

TEST(RankGrid, DescribeContextParallel) {
  const std::string text = RankGrid(GridSizes{1, 2, 1, 1}).describe();
  EXPECT_EQ(text,
            "rank grid tp=1 cp=2 dp=1 pp=1 (world 2, order tp-cp-dp-pp)\n"
            "rank 0: tp=0 cp=0 dp=0 pp=0\n"
            "rank 1: tp=0 cp=1 dp=0 pp=0\n"
            "tp group 0: 0\n"
            "tp group 1: 1\n"
            "cp group 0: 0 1\n"
            "dp group 0: 0\n"
            "dp group 1: 1\n"
            "gradient (dp x cp) group 0: 0 1\n"
            "pp group 0: 0\n"
            "pp group 1: 1\n"
            "embedding group 0: 0\n"
            "embedding group 1: 1\n");
}

}  // namespace
}  // namespace pptrain
