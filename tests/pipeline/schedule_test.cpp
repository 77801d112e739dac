// Schedule builders: names, constraints, and hand-written golden action lists.
#include <gtest/gtest.h>

#include <stdexcept>

#include "pipeline/schedule.hpp"

namespace pptrain {
namespace {

using L = std::vector<Action>;
Action RF(int mb, int c = 0) { return {Op::RecvForward, mb, c}; }
Action F(int mb, int c = 0) { return {Op::Forward, mb, c}; }
Action SF(int mb, int c = 0) { return {Op::SendForward, mb, c}; }
Action RB(int mb, int c = 0) { return {Op::RecvBackward, mb, c}; }
Action B(int mb, int c = 0) { return {Op::BackwardInput, mb, c}; }
Action SB(int mb, int c = 0) { return {Op::SendBackward, mb, c}; }
Action W(int mb, int c = 0) { return {Op::BackwardWeight, mb, c}; }

std::string show(const L& list) {
  std::string out;
  for (const auto& a : list) out += to_string(a) + " ";
  return out;
}

L compute_only(const L& list) {
  L out;
  for (const auto& a : list)
    if (a.op == Op::Forward || a.op == Op::BackwardInput || a.op == Op::BackwardWeight)
      out.push_back(a);
  return out;
}

TEST(Schedule, NamesRoundTrip) {
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                    ScheduleKind::ZeroBubbleH1})
    EXPECT_EQ(parse_choice<ScheduleKind>(name_of(kind)), kind);
  EXPECT_EQ(name_of(ScheduleKind::ZeroBubbleH1), "zb-h1");
  EXPECT_EQ(parse_choice<ScheduleKind>("1F1B"), std::nullopt);
  EXPECT_EQ(parse_choice<ScheduleKind>(""), std::nullopt);
}

TEST(Schedule, ConstraintErrors) {
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::OneFOneB, 4, 3, 1), "");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::GPipe, 1, 1, 1), "");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::ZeroBubbleH1, 8, 2, 1), "");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::Interleaved, 4, 8, 2), "");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::OneFOneB, 4, 8, 2),
            "virtual_stages must be 1 for 1f1b (got 2)");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::Interleaved, 4, 6, 2),
            "interleaved needs micro_batches to be a multiple of pp (got 6 and 4)");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::Interleaved, 4, 8, 1),
            "interleaved needs virtual_stages >= 2 (got 1)");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::Interleaved, 1, 4, 2),
            "interleaved needs pp >= 2 (got 1)");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::GPipe, 0, 4, 1), "pp must be >= 1 (got 0)");
  EXPECT_EQ(schedule_constraint_error(ScheduleKind::GPipe, 2, 0, 1),
            "micro_batches must be >= 1 (got 0)");
  EXPECT_THROW(build_schedule(ScheduleKind::Interleaved, 4, 0, 6, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 4, 4, 8, 1), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 4, -1, 8, 1), std::invalid_argument);
}

// 1F1B, p=2, m=3. Stage 0 warms up with one forward; each steady step is a forward and
// the oldest backward; the cool-down has the last backward. Stage 1 (last) has no
// warm-up and never receives gradients: its loss starts each backward.
TEST(Schedule, Golden1F1BTwoStagesThreeMicrobatches) {
  const L stage0 = {F(0), SF(0),                          // warm-up
                    F(1), SF(1), RB(0), B(0), W(0),       // steady
                    F(2), SF(2), RB(1), B(1), W(1),
                    RB(2), B(2), W(2)};                   // cool-down
  const L stage1 = {RF(0), F(0), B(0), W(0), SB(0),
                    RF(1), F(1), B(1), W(1), SB(1),
                    RF(2), F(2), B(2), W(2), SB(2)};
  EXPECT_EQ(build_schedule(ScheduleKind::OneFOneB, 2, 0, 3, 1), stage0)
      << show(build_schedule(ScheduleKind::OneFOneB, 2, 0, 3, 1));
  EXPECT_EQ(build_schedule(ScheduleKind::OneFOneB, 2, 1, 3, 1), stage1)
      << show(build_schedule(ScheduleKind::OneFOneB, 2, 1, 3, 1));
}

// ZB-H1, p=2, m=2. The gradient leaves right after B. Stage 0 defers W by zero
// microbatches; stage 1 by one, so its W(0) follows B(1) and W(1) closes the list.
TEST(Schedule, GoldenZeroBubbleH1TwoStagesTwoMicrobatches) {
  const L stage0 = {F(0), SF(0), F(1), SF(1), RB(0), B(0), W(0), RB(1), B(1), W(1)};
  const L stage1 = {RF(0), F(0), B(0), SB(0), RF(1), F(1), B(1), SB(1), W(0), W(1)};
  EXPECT_EQ(build_schedule(ScheduleKind::ZeroBubbleH1, 2, 0, 2, 1), stage0)
      << show(build_schedule(ScheduleKind::ZeroBubbleH1, 2, 0, 2, 1));
  EXPECT_EQ(build_schedule(ScheduleKind::ZeroBubbleH1, 2, 1, 2, 1), stage1)
      << show(build_schedule(ScheduleKind::ZeroBubbleH1, 2, 1, 2, 1));
}

// GPipe, p=2, m=2: all forwards, then backwards in microbatch order.
TEST(Schedule, GoldenGPipe) {
  const L stage0 = {F(0), SF(0), F(1), SF(1), RB(0), B(0), W(0), RB(1), B(1), W(1)};
  const L stage1 = {RF(0), F(0), RF(1), F(1), B(0), W(0), SB(0), B(1), W(1), SB(1)};
  EXPECT_EQ(build_schedule(ScheduleKind::GPipe, 2, 0, 2, 1), stage0);
  EXPECT_EQ(build_schedule(ScheduleKind::GPipe, 2, 1, 2, 1), stage1);
}

// Interleaved, p=2, m=4, v=2, compute actions only. Forwards visit microbatches in
// groups of pp per chunk: (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backwards
// the same groups with chunks reversed. Warm-up: 2*(pp-stage-1) + (v-1)*pp forwards.
TEST(Schedule, GoldenInterleavedComputeOrder) {
  const L stage0 = {F(0, 0), F(1, 0), F(0, 1), F(1, 1),             // warm-up: 4
                    F(2, 0), B(0, 1), W(0, 1), F(3, 0), B(1, 1), W(1, 1),
                    F(2, 1), B(0, 0), W(0, 0), F(3, 1), B(1, 0), W(1, 0),
                    B(2, 1), W(2, 1), B(3, 1), W(3, 1),             // cool-down
                    B(2, 0), W(2, 0), B(3, 0), W(3, 0)};
  const L stage1 = {F(0, 0), F(1, 0),                               // warm-up: 2
                    F(0, 1), B(0, 1), W(0, 1), F(1, 1), B(1, 1), W(1, 1),
                    F(2, 0), B(0, 0), W(0, 0), F(3, 0), B(1, 0), W(1, 0),
                    F(2, 1), B(2, 1), W(2, 1), F(3, 1), B(3, 1), W(3, 1),
                    B(2, 0), W(2, 0), B(3, 0), W(3, 0)};           // cool-down
  EXPECT_EQ(compute_only(build_schedule(ScheduleKind::Interleaved, 2, 0, 4, 2)), stage0);
  EXPECT_EQ(compute_only(build_schedule(ScheduleKind::Interleaved, 2, 1, 4, 2)), stage1);
  // Stage 1's chunk 0 is virtual stage 1 of 4, not the last: its output goes on to
  // stage 0's chunk 1.
  const L full1 = build_schedule(ScheduleKind::Interleaved, 2, 1, 4, 2);
  EXPECT_EQ(std::vector<Action>(full1.begin(), full1.begin() + 3),
            (L{RF(0, 0), F(0, 0), SF(0, 0)}));
}

TEST(Schedule, OneStageIsForwardBackwardWeightPerMicrobatch) {
  L expected;
  for (int mb = 0; mb < 4; ++mb) expected.insert(expected.end(), {F(mb), B(mb), W(mb)});
  EXPECT_EQ(build_schedule(ScheduleKind::OneFOneB, 1, 0, 4, 1), expected);
  EXPECT_EQ(build_schedule(ScheduleKind::ZeroBubbleH1, 1, 0, 4, 1), expected);
  // GPipe keeps its shape on one stage: all forwards first.
  EXPECT_EQ(build_schedule(ScheduleKind::GPipe, 1, 0, 2, 1),
            (L{F(0), F(1), B(0), W(0), B(1), W(1)}));
}

TEST(Schedule, ActivationBounds) {
  EXPECT_EQ(activation_bound(ScheduleKind::GPipe, 4, 2, 6, 1), 6);
  EXPECT_EQ(activation_bound(ScheduleKind::OneFOneB, 4, 0, 6, 1), 4);
  EXPECT_EQ(activation_bound(ScheduleKind::OneFOneB, 4, 3, 6, 1), 1);
  EXPECT_EQ(activation_bound(ScheduleKind::OneFOneB, 4, 0, 2, 1), 2);
  EXPECT_EQ(activation_bound(ScheduleKind::ZeroBubbleH1, 4, 3, 6, 1), 4);
  EXPECT_EQ(backward_bound(ScheduleKind::ZeroBubbleH1, 4, 3, 6, 1), 1);
  // Interleaved, p=4, v=2, m=8: warm-up 2*(4-s-1) + 4, plus the steady forward.
  EXPECT_EQ(activation_bound(ScheduleKind::Interleaved, 4, 0, 8, 2), 11);
  EXPECT_EQ(activation_bound(ScheduleKind::Interleaved, 4, 3, 8, 2), 5);
  EXPECT_EQ(activation_bound(ScheduleKind::Interleaved, 4, 3, 4, 2), 8);  // m == pp: all warm-up
}

}  // namespace
}  // namespace pptrain
