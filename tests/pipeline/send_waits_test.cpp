// sends_waitable_from against the simulator: waiting for a background send from the step
// it gives never deadlocks, and waiting one step earlier does (the bound is the least),
// over every schedule and a sweep of sizes.
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>

#include "pipeline/send_waits.hpp"
#include "pipeline/simulator.hpp"

namespace pptrain {
namespace {

constexpr ScheduleKind kAll[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                 ScheduleKind::Interleaved, ScheduleKind::ZeroBubbleH1,
                                 ScheduleKind::ZeroBubbleV};

// The steps with stage s's background sends of step i posted instead as a blocking batch
// just before its step k (> i): the stage then waits for them there. Posting them later
// can only delay their receivers, so if this completes, so does posting at i and
// waiting at k.
std::vector<std::vector<Step>> wait_at(std::vector<std::vector<Step>> steps, int s, std::size_t i,
                                       std::size_t k) {
  auto& list = steps[size_t(s)];
  Step blocking{Step::Messages, list[i].actions};
  list.insert(list.begin() + std::ptrdiff_t(k), blocking);
  list.erase(list.begin() + std::ptrdiff_t(i));
  return steps;
}

bool completes(const std::vector<std::vector<Step>>& steps, const Placement& placement, int m) {
  try {
    simulate_steps(steps, placement, m, MessageMode::AsyncSends);
    return true;
  } catch (const std::logic_error&) {
    return false;
  }
}

TEST(SendWaits, WaitingFromTheBoundCompletesAndOneStepEarlierDeadlocks) {
  int checked = 0, tight = 0;
  for (ScheduleKind kind : kAll)
    for (int pp : {2, 3, 4})
      for (int m : {1, 2, 4, 6})
        for (int v : {1, 2}) {
          if (!schedule_constraint_error(kind, pp, m, v).empty()) continue;
          SCOPED_TRACE(std::string(name_of(kind)) + " pp " + std::to_string(pp) + " m " +
                       std::to_string(m) + " v " + std::to_string(v));
          const Placement placement = schedule_placement(kind, pp, v);
          const auto steps = build_all_steps(kind, pp, m, v, MessageMode::AsyncSends);
          const auto from = sends_waitable_from(steps, placement);
          ASSERT_EQ(from.size(), steps.size());
          for (int s = 0; s < pp; ++s) {
            const auto& list = steps[size_t(s)];
            ASSERT_EQ(from[size_t(s)].size(), list.size());
            for (std::size_t i = 0; i < list.size(); ++i) {
              const std::size_t k = from[size_t(s)][i];
              ASSERT_GT(k, i);
              if (list[i].kind != Step::PostSends) {
                EXPECT_EQ(k, i + 1);
                continue;
              }
              ASSERT_LE(k, list.size());
              EXPECT_TRUE(completes(wait_at(steps, s, i, k), placement, m))
                  << "stage " << s << " step " << i << " waited for at " << k;
              ++checked;
              if (k > i + 1) {
                EXPECT_FALSE(completes(wait_at(steps, s, i, k - 1), placement, m))
                    << "stage " << s << " step " << i << " could be waited for at " << k - 1;
                ++tight;
              }
            }
          }
        }
  EXPECT_GT(checked, 100);
  EXPECT_GT(tight, 0);  // zb-v has sends whose receivers need the sender's later steps
}

TEST(SendWaits, OneFOneBGradientIsWaitableRightAfterItIsPosted) {
  // pp 2: the first stage posts the receive of gradient 0 after sending activation 1,
  // without waiting for the last stage, so the last stage may wait for it at once.
  const Placement placement = schedule_placement(ScheduleKind::OneFOneB, 2, 1);
  const auto steps = build_all_steps(ScheduleKind::OneFOneB, 2, 4, 1, MessageMode::AsyncSends);
  const auto from = sends_waitable_from(steps, placement);
  for (std::size_t i = 0; i < steps[1].size(); ++i) EXPECT_EQ(from[1][i], i + 1) << i;
}

TEST(SendWaits, GroupedBatchesCompleteTheirOwnSends) {
  const Placement placement = schedule_placement(ScheduleKind::Interleaved, 2, 2);
  const auto steps = build_all_steps(ScheduleKind::Interleaved, 2, 4, 2, MessageMode::Grouped);
  const auto from = sends_waitable_from(steps, placement);
  for (int s = 0; s < 2; ++s)
    for (std::size_t i = 0; i < steps[size_t(s)].size(); ++i) EXPECT_EQ(from[size_t(s)][i], i + 1);
}

}  // namespace
}  // namespace pptrain
