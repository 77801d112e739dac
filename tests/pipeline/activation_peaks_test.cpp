// activation_peaks: what a stage allocates while it runs its steps, with sets reused at
// once, and with sets whose background sends make them reusable only later.
#include <gtest/gtest.h>

#include "pipeline/activation_peaks.hpp"
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

// Boundary arrays are lent one by one, not kept with every set. In 1f1b with blocking
// batches (a GPU) the first stage holds pp sets in its warm-up, but each output goes back
// with the batch that sends it (which, in the steady state, also receives the gradient
// B needs next), and the gradients are held from their receive to the release: two at
// once, where keeping all three with every set would be 3 * pp.
TEST(ActivationPeaks, BoundaryArraysAreLentFromFirstUseNotPerSet) {
  const int pp = 4, m = 8;
  const Placement placement = schedule_placement(ScheduleKind::OneFOneB, pp, 1);
  const auto steps = build_all_steps(ScheduleKind::OneFOneB, pp, m, 1, MessageMode::Grouped);
  const ActivationPeaks first = activation_peaks(steps[0], placement, 0, {false});
  EXPECT_EQ(first.sets[0], pp);
  EXPECT_EQ(first.boundaries, 2);
  EXPECT_EQ(activation_peaks(steps[1], placement, 1, {false}).boundaries, 2);
  // The last stage keeps its output for the head's backward, with both gradients.
  EXPECT_EQ(activation_peaks(steps[pp - 1], placement, pp - 1, {false}).boundaries, 3);
}

// zb-v's hop between a rank's two chunks (the last stage holds virtual stages pp-1 and
// pp) writes straight into the other set: the hop's output and input gradient lend no
// array of their own.
TEST(ActivationPeaks, AHopOnTheRankLendsNoArray) {
  const int pp = 2, m = 1;
  const Placement placement = schedule_placement(ScheduleKind::ZeroBubbleV, pp, 2);
  const auto steps = build_all_steps(ScheduleKind::ZeroBubbleV, pp, m, 2, MessageMode::Grouped);
  // One micro-batch through the last stage: chunk 0's output is chunk 1's input, chunk
  // 1 (not last: stage 0 holds the head) sends its output and receives its gradient,
  // and its input gradient is chunk 0's output gradient. Chunk 0 then sends its own
  // input gradient: three arrays at most.
  EXPECT_EQ(activation_peaks(steps[pp - 1], placement, pp - 1, {false, false}).boundaries, 3);
}

}  // namespace
}  // namespace pptrain
