// The channels the pipeline's messages travel on (MessageMode::Channels): one a
// direction and kind between stages that exchange messages, the same list on every rank.
#include <gtest/gtest.h>

#include "pipeline/executor.hpp"

namespace pptrain {
namespace {

using Channel = comm::PipelineChannel;
constexpr int A = kActivationChannel, G = kGradientChannel;

TEST(PipelineChannels, LoopedStagesPairNeighboursBothWays) {
  // 1F1B at pp 3 over two pipelines: activations down, gradients up, no wrap-around.
  const auto got = pipeline_channels(schedule_placement(ScheduleKind::OneFOneB, 3, 1), {{0, 2, 4}, {1, 3, 5}});
  const std::vector<Channel> want{{0, 2, A}, {2, 0, G}, {2, 4, A}, {4, 2, G},
                                  {1, 3, A}, {3, 1, G}, {3, 5, A}, {5, 3, G}};
  EXPECT_EQ(got, want);
}

TEST(PipelineChannels, InterleavedWrapsAroundFromTheLastStage) {
  const auto got = pipeline_channels(schedule_placement(ScheduleKind::Interleaved, 2, 2), {{0, 1}});
  // Stage 1's first chunk feeds stage 0's second: both directions carry both kinds.
  const std::vector<Channel> want{{0, 1, A}, {1, 0, G}, {1, 0, A}, {0, 1, G}};
  EXPECT_EQ(got, want);
}

TEST(PipelineChannels, TheVTurnsOnOneStageWithoutAChannel) {
  // ZB-V at pp 2: chunk 0 runs down to stage 1, whose chunk 1 (a local copy) runs back up.
  const auto got = pipeline_channels(schedule_placement(ScheduleKind::ZeroBubbleV, 2, 2), {{0, 1}});
  const std::vector<Channel> want{{0, 1, A}, {1, 0, G}, {1, 0, A}, {0, 1, G}};
  EXPECT_EQ(got, want);
}

TEST(PipelineChannels, OneStageHasNone) {
  EXPECT_TRUE(pipeline_channels(schedule_placement(ScheduleKind::OneFOneB, 1, 1), {{0}}).empty());
}

}  // namespace
}  // namespace pptrain
