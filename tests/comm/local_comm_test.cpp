// One-rank communicators: every group has one member, collectives keep or copy the
// data, and the world exchanges only with itself (matching sends to receives by tag).
#include <gtest/gtest.h>

#include <vector>

#include "comm/comm.hpp"

namespace pptrain::comm {
namespace {

TEST(LocalComms, EveryGroupHasOneMember) {
  Comms c = make_local_comms();
  ASSERT_TRUE(c.world && c.all && c.tp && c.dp && c.pp && c.embedding);
  EXPECT_EQ(c.world->rank(), 0);
  EXPECT_EQ(c.world->size(), 1);
  for (Group* g : {c.all.get(), c.tp.get(), c.dp.get(), c.pp.get(), c.embedding.get()}) {
    EXPECT_EQ(g->rank(), 0) << g->name();
    EXPECT_EQ(g->size(), 1) << g->name();
    EXPECT_EQ(g->world_ranks(), std::vector<int>{0}) << g->name();
  }
  EXPECT_EQ(c.tp->name(), "tp(dp=0,pp=0)");
  EXPECT_EQ(c.dp->name(), "dp(tp=0,pp=0)");
  EXPECT_EQ(c.pp->name(), "pp(tp=0,dp=0)");
  EXPECT_EQ(c.embedding->name(), "embedding(tp=0,dp=0)");
  EXPECT_EQ(c.all->name(), "world");
}

TEST(LocalComms, CollectivesKeepOrCopyTheData) {
  Comms c = make_local_comms();
  std::vector<float> f = {1.5f, -2.0f, 3.0f};
  c.tp->all_reduce(f.data(), f.size(), ReduceOp::Sum);
  c.dp->all_reduce(f.data(), f.size(), ReduceOp::Max);
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  std::vector<double> d = {0.25, 7.0};
  c.pp->all_reduce(d.data(), d.size(), ReduceOp::Sum);
  EXPECT_EQ(d, (std::vector<double>{0.25, 7.0}));

  std::vector<float> out(3, 0.0f);
  c.tp->reduce_scatter(f.data(), out.data(), 3);
  EXPECT_EQ(out, f);
  std::fill(out.begin(), out.end(), 0.0f);
  c.tp->all_gather(f.data(), out.data(), 3);
  EXPECT_EQ(out, f);
  c.tp->all_gather(out.data(), out.data(), 3);  // in place
  EXPECT_EQ(out, f);
  c.dp->broadcast(f.data(), f.size(), 0);
  EXPECT_THROW(c.dp->broadcast(f.data(), f.size(), 1), std::logic_error);

  auto op = c.dp->all_reduce_start(f.data(), f.size());
  op->wait();
  op->wait();
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  c.world->barrier();
}

TEST(LocalComms, ExchangeWithItselfMatchesByTag) {
  Comms c = make_local_comms();
  std::vector<float> a = {1, 2}, b = {3, 4, 5}, ra(2), rb(3);
  // Receives listed before the sends, and in the opposite tag order.
  c.world->exchange({{Transfer::Recv, 0, rb.data(), 3 * sizeof(float), 8},
                     {Transfer::Recv, 0, ra.data(), 2 * sizeof(float), 7},
                     {Transfer::Send, 0, a.data(), 2 * sizeof(float), 7},
                     {Transfer::Send, 0, b.data(), 3 * sizeof(float), 8}});
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  std::fill(ra.begin(), ra.end(), 0.0f);
  auto op = c.world->exchange_start(
      {{Transfer::Send, 0, a.data(), 2 * sizeof(float), 1}, {Transfer::Recv, 0, ra.data(), 2 * sizeof(float), 1}});
  op->wait();
  EXPECT_EQ(ra, a);
}

TEST(LocalComms, UnmatchedOrForeignTransfersAreErrors) {
  Comms c = make_local_comms();
  std::vector<float> a(2), r(2);
  EXPECT_THROW(c.world->exchange({{Transfer::Send, 1, a.data(), 2 * sizeof(float), 0}}), std::logic_error);
  EXPECT_THROW(c.world->exchange({{Transfer::Send, 0, a.data(), 2 * sizeof(float), 0}}), std::logic_error);
  EXPECT_THROW(c.world->exchange({{Transfer::Recv, 0, r.data(), 2 * sizeof(float), 0}}), std::logic_error);
  EXPECT_THROW(c.world->exchange({{Transfer::Send, 0, a.data(), 2 * sizeof(float), 0},
                                  {Transfer::Recv, 0, r.data(), 2 * sizeof(float), 1}}),
               std::logic_error);
  EXPECT_THROW(c.world->exchange({{Transfer::Send, 0, a.data(), 1 * sizeof(float), 0},
                                  {Transfer::Recv, 0, r.data(), 2 * sizeof(float), 0}}),
               std::logic_error);
}

TEST(LocalCommsDeathTest, AbortExitsNonZeroWithTheMessage) {
  Comms c = make_local_comms();
  EXPECT_EXIT(c.world->abort("stage 3 lost its mind"), testing::ExitedWithCode(1),
              "pptrain: rank 0: stage 3 lost its mind");
}

}  // namespace
}  // namespace pptrain::comm
