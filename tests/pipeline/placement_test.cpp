// Placement: golden tables of where each virtual stage lives, looped and V, and the
// neighbours every schedule's messages follow.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "pipeline/placement.hpp"

namespace pptrain {
namespace {

// virtual stage of (stage, chunk), rows by stage.
std::vector<std::vector<int>> table(const Placement& p) {
  std::vector<std::vector<int>> out(size_t(p.pp()));
  for (int s = 0; s < p.pp(); ++s)
    for (int c = 0; c < p.chunks(); ++c) out[size_t(s)].push_back(p.virtual_stage(s, c));
  return out;
}

TEST(Placement, LoopedGolden) {
  const Placement p(PlacementKind::Looped, 4, 2);
  EXPECT_EQ(table(p), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(p.head_stage(), 3);
  EXPECT_EQ(p.next(3, 0), (ChunkLocation{0, 1}));  // the wrap-around to the first stage
  EXPECT_EQ(p.previous(0, 1), (ChunkLocation{3, 0}));
}

TEST(Placement, VGolden) {
  const Placement p(PlacementKind::V, 4, 2);
  EXPECT_EQ(table(p), (std::vector<std::vector<int>>{{0, 7}, {1, 6}, {2, 5}, {3, 4}}));
  EXPECT_EQ(p.head_stage(), 0);  // the head sits with the embedding
  EXPECT_TRUE(p.is_first(0, 0));
  EXPECT_TRUE(p.is_last(0, 1));
  EXPECT_EQ(p.next(3, 0), (ChunkLocation{3, 1}));  // the turn stays on one stage
  EXPECT_EQ(p.next(1, 1), (ChunkLocation{0, 1}));
  EXPECT_EQ(p.previous(2, 1), (ChunkLocation{3, 1}));
  const Placement four(PlacementKind::V, 2, 4);  // zig-zag: down, up, down, up
  EXPECT_EQ(table(four), (std::vector<std::vector<int>>{{0, 3, 4, 7}, {1, 2, 5, 6}}));
}

TEST(Placement, LocateInvertsVirtualStage) {
  for (PlacementKind kind : {PlacementKind::Looped, PlacementKind::V})
    for (int pp = 1; pp <= 5; ++pp)
      for (int v = 1; v <= 4; ++v) {
        const Placement p(kind, pp, v);
        for (int k = 0; k < p.virtual_stages(); ++k) {
          const ChunkLocation at = p.locate(k);
          EXPECT_EQ(p.virtual_stage(at.stage, at.chunk), k);
          if (k + 1 < p.virtual_stages()) {
            EXPECT_EQ(p.next(at.stage, at.chunk), p.locate(k + 1));
          }
        }
      }
}

TEST(Placement, RejectsWhatIsNotThere) {
  EXPECT_THROW(Placement(PlacementKind::V, 0, 2), std::invalid_argument);
  const Placement p(PlacementKind::Looped, 2, 2);
  EXPECT_THROW(p.virtual_stage(2, 0), std::logic_error);
  EXPECT_THROW(p.locate(4), std::logic_error);
  EXPECT_THROW(p.next(1, 1), std::logic_error);
  EXPECT_THROW(p.previous(0, 0), std::logic_error);
}

}  // namespace
}  // namespace pptrain
