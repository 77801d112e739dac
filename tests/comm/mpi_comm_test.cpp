// MPI communicators under mpirun with 1, 2 or 4 ranks: the (2,1,2) grid against hand
// tables, then every collective and the point-to-point exchange on every layout
// (tp, dp, pp) that fits the job, checked against values computed from world ranks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

#include "comm/comm.hpp"
#include "core/error.hpp"

namespace pptrain::comm {
namespace {

constexpr double kTimeout = 20;  // a hang ends the job well inside the ctest timeout

int world_size() {
  static const int size = MpiSession().world_size();  // MPI is up: main holds a session
  return size;
}

// Every (tp, dp, pp) whose product is the job size.
std::vector<RankGrid> layouts() {
  std::vector<RankGrid> out;
  const int n = world_size();
  for (int tp = 1; tp <= n; ++tp)
    for (int dp = 1; dp <= n; ++dp)
      if (n % (tp * dp) == 0) out.emplace_back(tp, dp, n / (tp * dp));
  return out;
}

std::string label(const RankGrid& g) {
  return "tp=" + std::to_string(g.tp()) + " dp=" + std::to_string(g.dp()) +
         " pp=" + std::to_string(g.pp());
}

std::vector<Group*> groups(const Comms& c) {
  std::vector<Group*> out = {c.all.get(), c.tp.get(), c.dp.get(), c.pp.get()};
  if (c.embedding) out.push_back(c.embedding.get());
  return out;
}

// --- The (2,1,2) grid with 4 ranks: ranks 0,1 are stage 0 and ranks 2,3 stage 1. ---

TEST(Grid212, GroupsMatchHandTables) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Comms c = make_mpi_comms(RankGrid(2, 1, 2), kTimeout);
  const int r = c.world->rank();
  const std::vector<std::vector<int>> tp = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> pp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  const char* tp_names[] = {"tp(dp=0,pp=0)", "tp(dp=0,pp=0)", "tp(dp=0,pp=1)", "tp(dp=0,pp=1)"};
  const char* pp_names[] = {"pp(tp=0,dp=0)", "pp(tp=1,dp=0)", "pp(tp=0,dp=0)", "pp(tp=1,dp=0)"};
  const char* dp_names[] = {"dp(tp=0,pp=0)", "dp(tp=1,pp=0)", "dp(tp=0,pp=1)", "dp(tp=1,pp=1)"};
  EXPECT_EQ(c.world->size(), 4);
  EXPECT_EQ(c.tp->world_ranks(), tp[r]);
  EXPECT_EQ(c.tp->rank(), r % 2);
  EXPECT_EQ(c.tp->name(), tp_names[r]);
  EXPECT_EQ(c.pp->world_ranks(), pp[r]);
  EXPECT_EQ(c.pp->rank(), r / 2);
  EXPECT_EQ(c.pp->name(), pp_names[r]);
  EXPECT_EQ(c.dp->world_ranks(), std::vector<int>{r});
  EXPECT_EQ(c.dp->name(), dp_names[r]);
  ASSERT_TRUE(c.embedding);  // both stages are first or last
  EXPECT_EQ(c.embedding->world_ranks(), pp[r]);
  EXPECT_EQ(c.embedding->name(), r % 2 ? "embedding(tp=1,dp=0)" : "embedding(tp=0,dp=0)");
  EXPECT_EQ(c.all->world_ranks(), (std::vector<int>{0, 1, 2, 3}));
}

TEST(Grid212, AllReduceOnEachGroupKind) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Comms c = make_mpi_comms(RankGrid(2, 1, 2), kTimeout);
  const int r = c.world->rank();
  // Rank r contributes (r+1)*(i+1) + 0.25 at element i. For each group: the sum of
  // (m+1) over its members m, and the largest member.
  struct Case { Group* g; float members_sum; int count; int max_member; };
  const Case cases[] = {
      {c.tp.get(), r < 2 ? 3.0f : 7.0f, 2, r < 2 ? 1 : 3},
      {c.pp.get(), r % 2 ? 6.0f : 4.0f, 2, r % 2 ? 3 : 2},
      {c.dp.get(), static_cast<float>(r + 1), 1, r},
      {c.embedding.get(), r % 2 ? 6.0f : 4.0f, 2, r % 2 ? 3 : 2},
      {c.all.get(), 10.0f, 4, 3}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.g->name());
    const int n = 5;
    std::vector<float> f(n), fm(n);
    std::vector<double> d(n), dm(n);
    for (int i = 0; i < n; ++i) {
      f[i] = fm[i] = static_cast<float>((r + 1) * (i + 1)) + 0.25f;
      d[i] = dm[i] = (r + 1) * (i + 1) + 0.125;
    }
    k.g->all_reduce(f.data(), n, ReduceOp::Sum);
    k.g->all_reduce(fm.data(), n, ReduceOp::Max);
    k.g->all_reduce(d.data(), n, ReduceOp::Sum);
    k.g->all_reduce(dm.data(), n, ReduceOp::Max);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(f[i], k.members_sum * (i + 1) + 0.25f * k.count);
      EXPECT_EQ(fm[i], static_cast<float>((k.max_member + 1) * (i + 1)) + 0.25f);
      EXPECT_EQ(d[i], k.members_sum * (i + 1) + 0.125 * k.count);
      EXPECT_EQ(dm[i], (k.max_member + 1) * (i + 1) + 0.125);
    }
  }
}

// --- Every layout of the job. ---

TEST(MpiComms, GroupsFollowTheGrid) {
  for (const RankGrid& grid : layouts()) {
    SCOPED_TRACE(label(grid));
    Comms c = make_mpi_comms(grid, kTimeout);
    const int r = c.world->rank();
    EXPECT_EQ(c.tp->world_ranks(), grid.tp_group(r));
    EXPECT_EQ(c.dp->world_ranks(), grid.dp_group(r));
    EXPECT_EQ(c.pp->world_ranks(), grid.pp_group(r));
    EXPECT_EQ(c.embedding != nullptr, grid.embedding_group_index(r) >= 0);
    if (c.embedding) {
      EXPECT_EQ(c.embedding->world_ranks(), grid.embedding_group(r));
    }
    for (Group* g : groups(c)) {
      EXPECT_EQ(g->size(), static_cast<int>(g->world_ranks().size())) << g->name();
      EXPECT_EQ(g->world_ranks()[static_cast<std::size_t>(g->rank())], r) << g->name();
    }
    c.world->barrier();
  }
}

TEST(MpiComms, AllReduceMatchesTheMembersValues) {
  for (const RankGrid& grid : layouts()) {
    SCOPED_TRACE(label(grid));
    Comms c = make_mpi_comms(grid, kTimeout);
    const int r = c.world->rank();
    for (Group* g : groups(c)) {
      std::vector<float> f = {static_cast<float>(r), 1.0f};
      g->all_reduce(f.data(), f.size(), ReduceOp::Sum);
      const auto& m = g->world_ranks();
      EXPECT_EQ(f[0], static_cast<float>(std::accumulate(m.begin(), m.end(), 0))) << g->name();
      EXPECT_EQ(f[1], static_cast<float>(m.size())) << g->name();
      std::vector<double> d = {-static_cast<double>(r)};
      g->all_reduce(d.data(), 1, ReduceOp::Max);
      EXPECT_EQ(d[0], -static_cast<double>(m.front())) << g->name();
    }
  }
}

TEST(MpiComms, ReduceScatterAllGatherBroadcast) {
  for (const RankGrid& grid : layouts()) {
    SCOPED_TRACE(label(grid));
    Comms c = make_mpi_comms(grid, kTimeout);
    const int r = c.world->rank();
    for (Group* g : groups(c)) {
      SCOPED_TRACE(g->name());
      const int n = g->size(), me = g->rank();
      const auto& m = g->world_ranks();
      const int member_sum = std::accumulate(m.begin(), m.end(), 0);
      const std::size_t k = 3;
      // reduce_scatter: rank r sends r*100 + i at i; block b sums to sum(m)*100 + i.
      std::vector<float> send(k * n), recv(k, -1.0f);
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(r * 100 + i);
      std::vector<float> in_place = send;
      g->reduce_scatter(send.data(), recv.data(), k);
      g->reduce_scatter(in_place.data(), in_place.data(), k);
      for (std::size_t j = 0; j < k; ++j) {
        const float want = static_cast<float>(member_sum * 100 + n * (me * k + j));
        EXPECT_EQ(recv[j], want);
        EXPECT_EQ(in_place[j], want);
      }
      // all_gather: block b is member b's world rank, repeated.
      std::vector<float> mine(k, static_cast<float>(r)), all(k * n, -1.0f);
      g->all_gather(mine.data(), all.data(), k);
      std::vector<float> all2(k * n, -1.0f);
      std::copy(mine.begin(), mine.end(), all2.begin() + static_cast<long>(k) * me);
      g->all_gather(all2.data() + k * me, all2.data(), k);
      for (int b = 0; b < n; ++b)
        for (std::size_t j = 0; j < k; ++j) {
          EXPECT_EQ(all[b * k + j], static_cast<float>(m[b]));
          EXPECT_EQ(all2[b * k + j], static_cast<float>(m[b]));
        }
      // bf16 arrays (the CUDA backend's activations, when host groups carry them): a
      // gather moves their bits at any size, above the eager limit too; a sum is refused.
      const std::size_t big = 40000;  // 80 KB per rank
      std::vector<uint16_t> bf(big), bf_all(big * n, 0);
      for (std::size_t i = 0; i < big; ++i) bf[i] = static_cast<uint16_t>(r * 7 + i);
      g->all_gather(bf.data(), bf_all.data(), big, DType::BF16);
      for (int b = 0; b < n; ++b)
        EXPECT_EQ(bf_all[b * big + big - 1], static_cast<uint16_t>(m[b] * 7 + big - 1));
      EXPECT_THROW(g->reduce_scatter(bf_all.data(), bf.data(), big, DType::BF16), std::runtime_error);
      // broadcast from every root.
      for (int root = 0; root < n; ++root) {
        std::vector<float> v = {static_cast<float>(r), 0.5f};
        g->broadcast(v.data(), v.size(), root);
        EXPECT_EQ(v[0], static_cast<float>(m[root]));
      }
      EXPECT_THROW(g->broadcast(nullptr, 0, n), std::logic_error);
    }
  }
}

TEST(MpiComms, AllReduceStartOverlapsSeveralBuckets) {
  for (const RankGrid& grid : layouts()) {
    SCOPED_TRACE(label(grid));
    Comms c = make_mpi_comms(grid, kTimeout);
    const int r = c.world->rank();
    const auto& m = c.dp->world_ranks();
    const float sum = static_cast<float>(std::accumulate(m.begin(), m.end(), 0));
    std::vector<std::vector<float>> buckets(3, std::vector<float>(1000));
    std::vector<std::unique_ptr<PendingOp>> ops;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      std::fill(buckets[b].begin(), buckets[b].end(), static_cast<float>(r + b));
      ops.push_back(c.dp->all_reduce_start(buckets[b].data(), buckets[b].size()));
    }
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) (*it)->wait();
    for (std::size_t b = 0; b < buckets.size(); ++b)
      EXPECT_EQ(buckets[b][999], sum + static_cast<float>(b * m.size()));
    ops[0]->wait();  // a second wait is harmless
  }
}

// ZeRO's in-place bucket collectives, with blocks of 64 KiB and more: block b of the
// reduce-scatter is the sum over members of (world rank * 1000 + element index), and the
// all-gather brings each member's block back to every member.
TEST(MpiComms, InPlaceReduceScatterAndAllGatherStartTheirBlocks) {
  for (const RankGrid& grid : layouts()) {
    SCOPED_TRACE(label(grid));
    Comms c = make_mpi_comms(grid, kTimeout);
    const int r = c.world->rank(), me = c.dp->rank();
    const auto& m = c.dp->world_ranks();
    const std::size_t block = 20000, n = block * m.size();
    const double ranks = std::accumulate(m.begin(), m.end(), 0.0);
    std::vector<float> data(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = float(r * 1000 + int(i % 4096));
    auto op = c.dp->reduce_scatter_start(data.data(), n);
    while (!op->test()) {
    }
    op->wait();  // harmless after test()
    for (std::size_t i = me * block; i < (me + 1) * block; i += 997)
      EXPECT_EQ(data[i], float(ranks * 1000 + double(m.size()) * double(i % 4096))) << i;
    for (std::size_t i = 0; i < n; ++i)
      if (i / block != std::size_t(me)) data[i] = -1.0f;
    std::fill(data.begin() + me * block, data.begin() + (me + 1) * block, float(r));
    c.dp->all_gather_start(data.data(), n)->wait();
    for (std::size_t b = 0; b < m.size(); ++b) EXPECT_EQ(data[b * block + 7], float(m[b]));
    if (m.size() > 1) {
      EXPECT_THROW(c.dp->reduce_scatter_start(data.data(), n + 1), std::logic_error);
    }
  }
}

// Each stage sends to the next stage and to the previous one in the same batch, large
// enough (4 MB) that blocking sends would deadlock.
TEST(MpiComms, PipelineNeighboursExchangeBothWays) {
  for (const RankGrid& grid : layouts()) {
    if (grid.pp() == 1) continue;
    SCOPED_TRACE(label(grid));
    Comms c = make_mpi_comms(grid, kTimeout);
    const int r = c.world->rank(), s = c.pp->rank(), stages = c.pp->size();
    const auto& p = c.pp->world_ranks();
    const std::size_t n = 1 << 20;
    const int next = s + 1 < stages ? p[s + 1] : -1, prev = s > 0 ? p[s - 1] : -1;
    std::vector<float> fwd(n, r + 0.5f), bwd(n, -r - 0.5f), from_prev(n), from_next(n);
    for (int round = 0; round < 2; ++round) {
      std::vector<Transfer> batch;
      if (next >= 0) batch.push_back({Transfer::Send, next, fwd.data(), n * sizeof(float), 1});
      if (prev >= 0) batch.push_back({Transfer::Send, prev, bwd.data(), n * sizeof(float), 2});
      if (prev >= 0) batch.push_back({Transfer::Recv, prev, from_prev.data(), n * sizeof(float), 1});
      if (next >= 0) batch.push_back({Transfer::Recv, next, from_next.data(), n * sizeof(float), 2});
      if (round == 0) c.world->exchange(batch);
      else c.world->exchange_start(batch)->wait();
      if (prev >= 0) {
        EXPECT_EQ(from_prev[n - 1], prev + 0.5f);
      }
      if (next >= 0) {
        EXPECT_EQ(from_next[0], -next - 0.5f);
      }
      std::fill(from_prev.begin(), from_prev.end(), 0.0f);
      std::fill(from_next.begin(), from_next.end(), 0.0f);
    }
  }
}

TEST(MpiComms, ExchangeMatchesByTag) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Comms c = make_mpi_comms(RankGrid(1, 1, world_size()), kTimeout);
  const int r = c.world->rank();
  if (r > 1) return;  // ranks 0 and 1 only: the others take no part
  const int peer = 1 - r;
  std::vector<float> a(4, r + 1.0f), b(2, r + 10.0f), ra(4), rb(2);
  // Rank 0 posts its receives in the opposite order to rank 1's sends.
  std::vector<Transfer> batch = {{Transfer::Send, peer, a.data(), 4 * sizeof(float), 5},
                                 {Transfer::Send, peer, b.data(), 2 * sizeof(float), 6}};
  if (r == 0) {
    batch.push_back({Transfer::Recv, peer, rb.data(), 2 * sizeof(float), 6});
    batch.push_back({Transfer::Recv, peer, ra.data(), 4 * sizeof(float), 5});
  } else {
    batch.push_back({Transfer::Recv, peer, ra.data(), 4 * sizeof(float), 5});
    batch.push_back({Transfer::Recv, peer, rb.data(), 2 * sizeof(float), 6});
  }
  c.world->exchange(batch);
  EXPECT_EQ(ra[3], peer + 1.0f);
  EXPECT_EQ(rb[1], peer + 10.0f);
  EXPECT_THROW(c.world->exchange({{Transfer::Send, world_size(), a.data(), 4, 0}}),
               std::logic_error);
  EXPECT_THROW(c.world->exchange({{Transfer::Send, peer, a.data(), 4 * sizeof(float), -1}}), std::logic_error);
}

TEST(MpiComms, WrongSizeOrDisagreeingGridsAreInputErrors) {
  EXPECT_THROW(make_mpi_comms(RankGrid(world_size() + 1, 1, 1), kTimeout), InputError);
  if (world_size() < 2) return;
  const int r = MpiSession().world_rank();
  const RankGrid mine = r == 0 ? RankGrid(world_size(), 1, 1) : RankGrid(1, 1, world_size());
  EXPECT_THROW(make_mpi_comms(mine, kTimeout), InputError);
}

// Ranks other than 0 print failures only, each line naming the rank.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace pptrain::comm

int main(int argc, char** argv) {
  pptrain::comm::MpiSession session;  // MPI stays up across every test's communicators
  testing::InitGoogleTest(&argc, argv);
  if (const int rank = session.world_rank(); rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new pptrain::comm::FailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}
