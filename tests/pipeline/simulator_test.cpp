// Simulator: every schedule over a sweep of sizes, bubble formulas, activation bounds,
// and hand-broken lists that must be rejected.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "pipeline/simulator.hpp"

namespace pptrain {
namespace {

using Lists = std::vector<std::vector<Action>>;
constexpr ScheduleKind kAll[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                 ScheduleKind::Interleaved, ScheduleKind::ZeroBubbleH1};

Lists build_all(ScheduleKind kind, int p, int m, int v) {
  Lists lists;
  for (int s = 0; s < p; ++s) lists.push_back(build_schedule(kind, p, s, m, v));
  return lists;
}

// Independent of the simulator: each (mb, chunk) of a stage has exactly one F, B and
// W in that order, a receive before F / B and a send after F / B exactly where the
// virtual stage has a neighbour.
void expect_well_formed(const std::vector<Action>& list, int p, int s, int m, int v) {
  std::map<std::pair<int, int>, std::map<Op, std::vector<int>>> at;
  for (int i = 0; i < int(list.size()); ++i)
    at[{list[size_t(i)].microbatch, list[size_t(i)].chunk}][list[size_t(i)].op].push_back(i);
  ASSERT_EQ(int(at.size()), m * v) << "stage " << s;
  for (auto& [unit, ops] : at) {
    const auto [mb, c] = unit;
    SCOPED_TRACE("stage " + std::to_string(s) + " mb " + std::to_string(mb) + " chunk " +
                 std::to_string(c));
    ASSERT_TRUE(mb >= 0 && mb < m && c >= 0 && c < v);
    for (Op op : {Op::Forward, Op::BackwardInput, Op::BackwardWeight})
      ASSERT_EQ(ops[op].size(), 1u) << op_name(op);
    EXPECT_LT(ops[Op::Forward][0], ops[Op::BackwardInput][0]);
    EXPECT_LT(ops[Op::BackwardInput][0], ops[Op::BackwardWeight][0]);
    const bool first = is_first_virtual_stage(s, c), last = is_last_virtual_stage(p, s, c, v);
    ASSERT_EQ(ops[Op::RecvForward].size(), first ? 0u : 1u);
    ASSERT_EQ(ops[Op::SendBackward].size(), first ? 0u : 1u);
    ASSERT_EQ(ops[Op::SendForward].size(), last ? 0u : 1u);
    ASSERT_EQ(ops[Op::RecvBackward].size(), last ? 0u : 1u);
    if (!first) {
      EXPECT_LT(ops[Op::RecvForward][0], ops[Op::Forward][0]);
      EXPECT_LT(ops[Op::BackwardInput][0], ops[Op::SendBackward][0]);
    }
    if (!last) {
      EXPECT_LT(ops[Op::Forward][0], ops[Op::SendForward][0]);
      EXPECT_LT(ops[Op::RecvBackward][0], ops[Op::BackwardInput][0]);
    }
  }
}

TEST(Simulator, EveryScheduleOverASweep) {
  int runs = 0;
  for (ScheduleKind kind : kAll) {
    for (int p = 2; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        for (int v : {1, 2, 3}) {
          if (!schedule_constraint_error(kind, p, m, v).empty()) continue;
          SCOPED_TRACE(schedule_name(kind) + " p=" + std::to_string(p) + " m=" +
                       std::to_string(m) + " v=" + std::to_string(v));
          const Lists lists = build_all(kind, p, m, v);
          for (int s = 0; s < p; ++s) expect_well_formed(lists[size_t(s)], p, s, m, v);
          const SimulationResult r = simulate_lists(lists, p, m, v);
          ASSERT_EQ(int(r.busy.size()), p);
          for (int s = 0; s < p; ++s) {
            EXPECT_NEAR(r.busy[size_t(s)], 3.0 * m, 1e-9);  // v chunks at 1/v each
            EXPECT_LE(r.peak_activations[size_t(s)], activation_bound(kind, p, s, m, v));
            EXPECT_LE(r.peak_awaiting_backward[size_t(s)], backward_bound(kind, p, s, m, v));
            if (kind != ScheduleKind::ZeroBubbleH1) {  // the bounds are tight
              EXPECT_EQ(r.peak_activations[size_t(s)], activation_bound(kind, p, s, m, v));
            }
          }
          EXPECT_DOUBLE_EQ(theoretical_bubble(kind, p, m, v), r.bubble);
          ++runs;
        }
      }
    }
  }
  EXPECT_EQ(runs, 3 * 7 * 16 + 2 * (8 + 5 + 4 + 3 + 2 + 2 + 2));  // interleaved: m % p == 0
}

TEST(Simulator, GPipeAndOneFOneBBubbleIsExact) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const double expected = double(p - 1) / (m + p - 1);
      EXPECT_NEAR(simulate(ScheduleKind::GPipe, p, m, 1).bubble, expected, 1e-12);
      EXPECT_NEAR(simulate(ScheduleKind::OneFOneB, p, m, 1).bubble, expected, 1e-12);
    }
  }
}

// With F = B = W, ZB-H1 idles (p-1) units per stage against 1F1B's 3(p-1): a third of
// the bubble time. As a fraction of the makespan: (p-1)/(3m+p-1) against
// (p-1)/(m+p-1), e.g. 0.2258 against 0.4667 at p = m = 8, 0.0204 against 0.0588 at
// p = 2, m = 16.
TEST(Simulator, ZeroBubbleH1CutsTheBubbleToAThird) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const SimulationResult zb = simulate(ScheduleKind::ZeroBubbleH1, p, m, 1);
      const SimulationResult ofob = simulate(ScheduleKind::OneFOneB, p, m, 1);
      EXPECT_LE(zb.bubble, ofob.bubble);
      if (m < p) continue;
      EXPECT_LT(zb.bubble, ofob.bubble);
      EXPECT_NEAR(zb.makespan - zb.busy[0], (ofob.makespan - ofob.busy[0]) / 3, 1e-12);
      EXPECT_NEAR(zb.bubble, double(p - 1) / (3 * m + p - 1), 1e-12);
    }
  }
  // The paper's general form: bubble time (p-1)(F+B-W) against 1F1B's (p-1)(F+B+W).
  const StageCosts costs{1, 2, 1, 0};
  EXPECT_DOUBLE_EQ(simulate(ScheduleKind::ZeroBubbleH1, 4, 8, 1, costs).makespan, 8 * 4 + 3 * 2);
  EXPECT_DOUBLE_EQ(simulate(ScheduleKind::OneFOneB, 4, 8, 1, costs).makespan, 8 * 4 + 3 * 4);
}

// Megatron: v chunks divide the bubble time by v, giving (p-1)/(v*m + p-1).
TEST(Simulator, InterleavedShrinksTheBubble) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = p; m <= 16; m += p) {
      for (int v : {2, 3}) {
        const double il = simulate(ScheduleKind::Interleaved, p, m, v).bubble;
        EXPECT_LT(il, simulate(ScheduleKind::OneFOneB, p, m, 1).bubble);
        EXPECT_NEAR(il, double(p - 1) / (v * m + p - 1), 1e-12);
      }
    }
  }
}

TEST(Simulator, GoldenTimings) {
  // 1F1B p=2 m=3 (see the golden lists): stage 0 ends with B(2), W(2) at 10..12.
  SimulationResult r = simulate(ScheduleKind::OneFOneB, 2, 3, 1);
  EXPECT_DOUBLE_EQ(r.makespan, 12);
  EXPECT_EQ(r.busy, (std::vector<double>{9, 9}));
  EXPECT_EQ(r.peak_activations, (std::vector<int>{2, 1}));
  // ZB-H1 p=2 m=2: stage 1 runs F0 B0 F1 B1 W0 W1 from t=1 without a gap, ending at 7.
  r = simulate(ScheduleKind::ZeroBubbleH1, 2, 2, 1);
  EXPECT_DOUBLE_EQ(r.makespan, 7);
  EXPECT_NEAR(r.bubble, 1.0 / 7, 1e-12);
  EXPECT_EQ(r.peak_activations, (std::vector<int>{2, 2}));
  EXPECT_EQ(r.peak_awaiting_backward, (std::vector<int>{2, 1}));
  // GPipe with message latency c: 3(m+p-1) + 2(p-1)c (one hop each way per stage).
  EXPECT_DOUBLE_EQ(simulate(ScheduleKind::GPipe, 4, 6, 1, {1, 1, 1, 0.5}).makespan, 27 + 3);
  // One stage: no messages, no bubble.
  r = simulate(ScheduleKind::OneFOneB, 1, 5, 1, {1, 1, 1, 10});
  EXPECT_DOUBLE_EQ(r.makespan, 15);
  EXPECT_DOUBLE_EQ(r.bubble, 0);
  EXPECT_EQ(r.peak_activations, std::vector<int>{1});
}

// --- Hand-broken lists, starting from 1F1B p=2 m=3 -------------------------------------

Lists golden_1f1b() { return build_all(ScheduleKind::OneFOneB, 2, 3, 1); }

std::string failure(const Lists& lists, int m = 3) {
  try {
    simulate_lists(lists, 2, m, 1);
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "";
}

void erase(std::vector<Action>& list, Op op, int mb) {
  const auto n =
      std::erase_if(list, [&](const Action& a) { return a.op == op && a.microbatch == mb; });
  ASSERT_EQ(n, 1u);
}

TEST(SimulatorRejects, DeadlockFromSwappedActions) {
  Lists lists = golden_1f1b();
  ASSERT_EQ(lists[0][1], (Action{Op::SendForward, 0, 0}));
  ASSERT_EQ(lists[0][4], (Action{Op::RecvBackward, 0, 0}));
  std::swap(lists[0][1], lists[0][4]);  // stage 0 waits for a gradient before sending
  const std::string msg = failure(lists);
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 0 waits at action 1 RecvBackward(mb 0, chunk 0) for stage 1"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 1 waits at action 0 RecvForward(mb 0, chunk 0) for stage 0"),
            std::string::npos) << msg;
}

TEST(SimulatorRejects, MissingSend) {
  Lists lists = golden_1f1b();
  erase(lists[0], Op::SendForward, 2);
  const std::string msg = failure(lists);
  EXPECT_NE(msg.find("stage 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RecvForward(mb 2, chunk 0): waits for a message that stage 0 never sends"),
            std::string::npos) << msg;
}

TEST(SimulatorRejects, WeightBeforeBackward) {
  Lists lists = golden_1f1b();
  ASSERT_EQ(lists[1][2], (Action{Op::BackwardInput, 0, 0}));
  std::swap(lists[1][2], lists[1][3]);
  const std::string msg = failure(lists);
  EXPECT_NE(msg.find("stage 1, action 2 BackwardWeight(mb 0, chunk 0): BackwardWeight before its "
                     "BackwardInput"), std::string::npos) << msg;
}

TEST(SimulatorRejects, BackwardBeforeLossOnTheLastStage) {
  Lists lists = golden_1f1b();
  std::swap(lists[1][1], lists[1][2]);  // B(0) before F(0) computed the loss
  EXPECT_NE(failure(lists).find("BackwardInput before its Forward"), std::string::npos);
}

TEST(SimulatorRejects, MessageNeverReceived) {
  Lists lists = golden_1f1b();
  for (Op op : {Op::RecvBackward, Op::BackwardInput, Op::BackwardWeight}) erase(lists[0], op, 2);
  for (Op op : {Op::RecvForward, Op::Forward, Op::BackwardInput, Op::BackwardWeight,
                Op::SendBackward})
    erase(lists[1], op, 2);
  EXPECT_NE(failure(lists).find(
                "stage 0 sends the activation of (mb 2, chunk 0) that stage 1 never receives"),
            std::string::npos) << failure(lists);
}

TEST(SimulatorRejects, ReceivesInAnotherOrderThanSent) {
  Lists lists = build_all(ScheduleKind::GPipe, 2, 2, 1);
  ASSERT_EQ(lists[1][0], (Action{Op::RecvForward, 0, 0}));
  std::swap(lists[1][0], lists[1][2]);  // RF(1) F(0) RF(0) F(1)
  std::swap(lists[1][1], lists[1][3]);
  const std::string msg = failure(lists, 2);
  EXPECT_NE(msg.find("oldest message from stage 0 on this channel is for (mb 0, chunk 0)"),
            std::string::npos) << msg;
}

TEST(SimulatorRejects, ReceiveOfTheWrongKind) {
  Lists lists = golden_1f1b();
  lists[1].insert(lists[1].begin() + 2, Action{Op::RecvBackward, 0, 0});
  EXPECT_NE(failure(lists).find("the last virtual stage has no next virtual stage"),
            std::string::npos);
}

TEST(SimulatorRejects, MissingOrDuplicatedCompute) {
  Lists lists = golden_1f1b();
  lists[0].pop_back();  // W(2)
  EXPECT_NE(failure(lists).find("stage 0 never runs BackwardWeight(mb 2, chunk 0)"),
            std::string::npos) << failure(lists);
  lists = golden_1f1b();
  lists[0].insert(lists[0].begin() + 1, Action{Op::Forward, 0, 0});
  EXPECT_NE(failure(lists).find("action 1 Forward(mb 0, chunk 0): duplicated"), std::string::npos);
  lists = golden_1f1b();
  lists[0][0].microbatch = 3;
  EXPECT_NE(failure(lists).find("out of range"), std::string::npos);
  EXPECT_THROW(simulate_lists(golden_1f1b(), 3, 3, 1), std::invalid_argument);
}

}  // namespace
}  // namespace pptrain
