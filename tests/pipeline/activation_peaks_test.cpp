// activation_peaks: what a stage allocates while it runs its steps, with sets reused at
// once, and with sets whose background sends make them reusable only later.
#include <gtest/gtest.h>

#include "pipeline/executor.hpp"
#include "pipeline/send_waits.hpp"

namespace pptrain {
namespace {

// With today's schedules a set's sends are always waitable by the time the rank next
// needs a set of that chunk: the plan holds nothing longer than the rank's own order.
TEST(ActivationPeaks, ReuseStepsCostNoSetInAnyScheduleSwept) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                            ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleV})
    for (int pp : {2, 3, 4, 8})
      for (int m : {1, 2, 4, 8, 16})
        for (int v : {1, 2, 4}) {
          if (!schedule_constraint_error(kind, pp, m, v).empty()) continue;
          const Placement placement = schedule_placement(kind, pp, v);
          const auto steps = build_all_steps(kind, pp, m, v, MessageMode::AsyncSends);
          const auto reusable = sends_waitable_from(steps, placement);
          for (int s = 0; s < pp; ++s) {
            const std::vector<bool> fused(size_t(v), false);
            EXPECT_EQ(activation_peaks(steps[size_t(s)], placement, s, fused, reusable[size_t(s)]).sets,
                      activation_peaks(steps[size_t(s)], placement, s, fused).sets)
                << name_of(kind) << " pp " << pp << " m " << m << " v " << v << " stage " << s;
          }
        }
}

TEST(ActivationPeaks, OneFOneBHoldsItsWarmUp) {
  const Placement placement = schedule_placement(ScheduleKind::OneFOneB, 4, 1);
  const auto steps = build_all_steps(ScheduleKind::OneFOneB, 4, 8, 1, MessageMode::AsyncSends);
  const auto reusable = sends_waitable_from(steps, placement);
  for (int s = 0; s < 4; ++s) {
    const ActivationPeaks own = activation_peaks(steps[size_t(s)], placement, s, {false});
    const ActivationPeaks planned =
        activation_peaks(steps[size_t(s)], placement, s, {false}, reusable[size_t(s)]);
    EXPECT_EQ(own.sets[0], 4 - s) << "stage " << s;  // min(m, pp - stage)
    EXPECT_EQ(planned.sets, own.sets) << "stage " << s;
    EXPECT_EQ(planned.until_b, own.until_b);
    EXPECT_EQ(planned.from_b, own.from_b);
  }
}

TEST(ActivationPeaks, ASetCountsUntilTheStepItIsReusedFrom) {
  // The last stage of 1f1b, pp 2: it receives activation k, runs F, B and W on it and
  // posts gradient k, so it holds one set at a time when each set is reused at once.
  const Placement placement = schedule_placement(ScheduleKind::OneFOneB, 2, 1);
  const auto steps = build_all_steps(ScheduleKind::OneFOneB, 2, 4, 1, MessageMode::AsyncSends);
  const auto& last = steps[1];
  std::vector<std::size_t> reusable(last.size()), send(4), receive(4);
  for (std::size_t i = 0; i < last.size(); ++i) {
    reusable[i] = i + 1;
    const Action& a = last[i].actions[0];
    if (a.op == Op::SendBackward) send[size_t(a.microbatch)] = i;
    if (a.op == Op::RecvForward) receive[size_t(a.microbatch)] = i;
  }
  auto sets = [&] { return activation_peaks(last, placement, 1, {false}, reusable).sets[0]; };
  ASSERT_EQ(receive[1], send[0] + 1);
  EXPECT_EQ(sets(), 1);
  // Set 0 reusable from the step after the one that acquires set 1: both are allocated.
  reusable[send[0]] = receive[1] + 1;
  EXPECT_EQ(sets(), 2);
  // Sets 0 and 1 reusable only after set 2 is acquired: three.
  reusable[send[0]] = reusable[send[1]] = receive[2] + 1;
  EXPECT_EQ(sets(), 3);
  // The parts lent between F and B go back with the release all the same.
  EXPECT_EQ(activation_peaks(last, placement, 1, {false}, reusable).until_b,
            activation_peaks(last, placement, 1, {false}).until_b);
}

}  // namespace
}  // namespace pptrain
