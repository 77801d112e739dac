// The emulated NCCL's results under mpirun (2 and 4 ranks): all-reduce sum and max in
// fp32 and bf16 equal a host reference reduced in rank order, bit for bit;
// reduce-scatter and all-gather in and out of place; broadcast and reduce; a grouped ring
// exchange both ways with large messages; point-to-point matched per peer in issue order
// across streams; communicators from two ids. The failures are in
// nccl_emulation_failure_test.cpp; main() is here.
#include <cmath>
#include <numeric>

#include "emulator_streams.hpp"
#include "nccl_test_util.hpp"

namespace pptrain::nccl_test {
namespace {

class NcclEmulation : public testing::Test {
 protected:
  void SetUp() override {
    comm_ = world_comm();
    ASSERT_NE(comm_, nullptr);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
  }
  const int rank_ = world_rank(), size_ = world_size();
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(NcclEmulation, Queries) {
  int n = 0, r = -1, d = -1, version = 0;
  NCCL_OK(ncclCommCount(comm_, &n));
  NCCL_OK(ncclCommUserRank(comm_, &r));
  NCCL_OK(ncclCommCuDevice(comm_, &d));
  NCCL_OK(ncclGetVersion(&version));
  int device = -1;
  CUDA_OK(cudaGetDevice(&device));
  EXPECT_EQ(n, size_);
  EXPECT_EQ(r, rank_);
  EXPECT_EQ(d, device);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm_, &async));
  EXPECT_EQ(async, ncclSuccess);
}

TEST_F(NcclEmulation, AllReduceFp32MatchesRankOrderBitForBit) {
  const std::size_t n = 10007;
  for (const ncclRedOp_t op : {ncclSum, ncclMax}) {
    std::vector<float> mine(n), expected(n);
    for (std::size_t i = 0; i < n; ++i) {
      mine[i] = input(rank_, i);
      float acc = input(0, i);
      for (int r = 1; r < size_; ++r)
        acc = op == ncclSum ? acc + input(r, i) : std::max(acc, input(r, i));
      expected[i] = acc;
    }
    DeviceArray<float> in(mine), out(n), inplace(mine);
    NCCL_OK(ncclAllReduce(in.get(), out.get(), n, ncclFloat32, op, comm_, stream_));
    NCCL_OK(ncclAllReduce(inplace.get(), inplace.get(), n, ncclFloat, op, comm_, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    const std::vector<float> got = out.download(), got_inplace = inplace.download();
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), n * 4), 0) << "op " << op;
    EXPECT_EQ(std::memcmp(got_inplace.data(), expected.data(), n * 4), 0) << "op " << op;
    EXPECT_EQ(in.download(), mine);  // out of place leaves the input alone
  }
}

TEST_F(NcclEmulation, AllReduceBf16SumsInFp32AndRoundsOnce) {
  const std::size_t n = 4099;
  for (const ncclRedOp_t op : {ncclSum, ncclMax}) {
    std::vector<std::uint16_t> mine(n), expected(n);
    for (std::size_t i = 0; i < n; ++i) {
      mine[i] = bf16_bits(input(rank_, i));
      float acc = bf16_value(bf16_bits(input(0, i)));
      for (int r = 1; r < size_; ++r) {
        const float x = bf16_value(bf16_bits(input(r, i)));
        acc = op == ncclSum ? acc + x : std::max(acc, x);
      }
      expected[i] = bf16_bits(acc);
    }
    DeviceArray<std::uint16_t> buf(mine);
    NCCL_OK(ncclAllReduce(buf.get(), buf.get(), n, ncclBfloat16, op, comm_, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(buf.download(), expected) << "op " << op;
  }
}

TEST_F(NcclEmulation, ReduceScatterInAndOutOfPlace) {
  const std::size_t block = 3001, n = block * static_cast<std::size_t>(size_);
  std::vector<float> mine(n), expected(block);
  for (std::size_t i = 0; i < n; ++i) mine[i] = input(rank_, i);
  const std::size_t at = static_cast<std::size_t>(rank_) * block;
  for (std::size_t i = 0; i < block; ++i) {
    float acc = input(0, at + i);
    for (int r = 1; r < size_; ++r) acc += input(r, at + i);
    expected[i] = acc;
  }
  DeviceArray<float> in(mine), out(block), inplace(mine);
  NCCL_OK(ncclReduceScatter(in.get(), out.get(), block, ncclFloat32, ncclSum, comm_, stream_));
  NCCL_OK(ncclReduceScatter(inplace.get(), inplace.get() + at, block, ncclFloat32, ncclSum, comm_,
                            stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(out.download(), expected);
  const std::vector<float> whole = inplace.download();
  EXPECT_EQ(std::vector<float>(whole.begin() + static_cast<long>(at),
                               whole.begin() + static_cast<long>(at + block)),
            expected);
}

TEST_F(NcclEmulation, AllGatherInAndOutOfPlace) {
  const std::size_t block = 2053, n = block * static_cast<std::size_t>(size_);
  std::vector<float> mine(block), expected(n);
  for (std::size_t i = 0; i < block; ++i) mine[i] = input(rank_, i);
  for (int r = 0; r < size_; ++r)
    for (std::size_t i = 0; i < block; ++i)
      expected[static_cast<std::size_t>(r) * block + i] = input(r, i);
  DeviceArray<float> in(mine), out(n), inplace(n);
  std::vector<float> start(n, -1.0f);
  std::copy(mine.begin(), mine.end(),
            start.begin() + static_cast<long>(rank_) * static_cast<long>(block));
  inplace.upload(start);
  NCCL_OK(ncclAllGather(in.get(), out.get(), block, ncclFloat32, comm_, stream_));
  NCCL_OK(ncclAllGather(inplace.get() + static_cast<std::size_t>(rank_) * block, inplace.get(),
                        block, ncclFloat32, comm_, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(out.download(), expected);
  EXPECT_EQ(inplace.download(), expected);
}

TEST_F(NcclEmulation, BroadcastAndReduce) {
  const std::size_t n = 777;
  const int root = size_ - 1;
  std::vector<float> mine(n), theirs(n), sum(n);
  for (std::size_t i = 0; i < n; ++i) {
    mine[i] = input(rank_, i);
    theirs[i] = input(root, i);
    float acc = input(0, i);
    for (int r = 1; r < size_; ++r) acc += input(r, i);
    sum[i] = acc;
  }
  DeviceArray<float> in(mine), out(n), inplace(mine), reduced(n);
  NCCL_OK(ncclBroadcast(in.get(), out.get(), n, ncclFloat32, root, comm_, stream_));
  NCCL_OK(ncclBroadcast(inplace.get(), inplace.get(), n, ncclFloat32, root, comm_, stream_));
  NCCL_OK(ncclReduce(in.get(), reduced.get(), n, ncclFloat32, ncclSum, root, comm_, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(out.download(), theirs);
  EXPECT_EQ(inplace.download(), theirs);
  if (rank_ == root) {
    EXPECT_EQ(reduced.download(), sum);
  }
}

// Each rank sends to both neighbours and receives from both, in one group: 64 KiB and
// larger messages (past every eager limit), which must not deadlock.
TEST_F(NcclEmulation, GroupedRingExchangeBothWays) {
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  for (const std::size_t n : {std::size_t(16384), std::size_t(300001)}) {
    std::vector<float> to_right(n), to_left(n);
    for (std::size_t i = 0; i < n; ++i) {
      to_right[i] = input(rank_, i);
      to_left[i] = -input(rank_, i + 1);
    }
    DeviceArray<float> sr(to_right), sl(to_left), from_left(n), from_right(n);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(sr.get(), n, ncclFloat32, right, comm_, stream_));
    NCCL_OK(ncclSend(sl.get(), n, ncclFloat32, left, comm_, stream_));
    NCCL_OK(ncclRecv(from_left.get(), n, ncclFloat32, left, comm_, stream_));
    NCCL_OK(ncclRecv(from_right.get(), n, ncclFloat32, right, comm_, stream_));
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(stream_));
    const std::vector<float> l = from_left.download(), r = from_right.download();
    // With two ranks left == right: the first send to a peer matches its first receive.
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(l[i], input(left, i)) << "n " << n << " i " << i;
      ASSERT_EQ(r[i], -input(right, i + 1)) << "n " << n << " i " << i;
    }
  }
}

// Pairs (0,1), (2,3): rank a issues two sends to b on two streams; b issues the receives
// on the streams the other way round. NCCL matches them in issue order, not by stream.
TEST_F(NcclEmulation, PointToPointMatchesPerPeerInIssueOrder) {
  cudaStream_t other = nullptr;
  CUDA_OK(cudaStreamCreate(&other));
  const int peer = rank_ ^ 1;
  if (peer < size_) {
    std::vector<float> a(100), b(300);
    std::iota(a.begin(), a.end(), 1.0f);
    std::iota(b.begin(), b.end(), 1000.0f);
    DeviceArray<float> first(rank_ % 2 == 0 ? a : std::vector<float>(100, 0.0f));
    DeviceArray<float> second(rank_ % 2 == 0 ? b : std::vector<float>(300, 0.0f));
    if (rank_ % 2 == 0) {
      NCCL_OK(ncclSend(first.get(), 100, ncclFloat32, peer, comm_, stream_));
      NCCL_OK(ncclSend(second.get(), 300, ncclFloat32, peer, comm_, other));
    } else {
      NCCL_OK(ncclRecv(first.get(), 100, ncclFloat32, peer, comm_, other));
      NCCL_OK(ncclRecv(second.get(), 300, ncclFloat32, peer, comm_, stream_));
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    CUDA_OK(cudaStreamSynchronize(other));
    EXPECT_EQ(first.download(), a);
    EXPECT_EQ(second.download(), b);
  }
  CUDA_OK(cudaStreamDestroy(other));
}

// A group on two streams starts once both have reached it: the send on one stream reads
// what a copy queued before the group on the other stream wrote. Under several stream
// schedules, since only some would run the send first.
TEST_F(NcclEmulation, GroupOnTwoStreamsWaitsForBoth) {
  cudaStream_t other = nullptr;
  CUDA_OK(cudaStreamCreate(&other));
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const std::size_t n = 20000;
  std::vector<float> payload(n), expected(n);
  for (std::size_t i = 0; i < n; ++i) {
    payload[i] = input(rank_, i);
    expected[i] = input(left, i);
  }
  const std::string saved = pptrain_emu::stream_schedule();
  for (const char* seed : {"0", "1", "2", "3", "4", "5"}) {
    if (saved != "sync") pptrain_emu::set_stream_schedule(seed);
    DeviceArray<float> out(std::vector<float>(n, 0.0f)), in(n);
    CUDA_OK(cudaMemcpyAsync(out.get(), payload.data(), n * 4, cudaMemcpyHostToDevice, other));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(out.get(), n, ncclFloat32, right, comm_, stream_));
    NCCL_OK(ncclRecv(in.get(), n, ncclFloat32, left, comm_, other));
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(stream_));
    CUDA_OK(cudaStreamSynchronize(other));
    EXPECT_EQ(in.download(), expected) << "schedule " << seed;
  }
  pptrain_emu::set_stream_schedule(saved);
  CUDA_OK(cudaStreamDestroy(other));
}

// A graph captured on two streams: an all-reduce on the origin, then a ring exchange as
// a group on both streams (the receive's stream joined the capture through an event and
// is joined back). Each launch exchanges again, with what the pinned input holds then,
// and an all-reduce issued directly between launches matches its peers' in issue order.
TEST_F(NcclEmulation, CapturedOperationsExchangeAgainAtEachLaunch) {
  cudaStream_t other = nullptr;
  CUDA_OK(cudaStreamCreate(&other));
  cudaEvent_t fork = nullptr, join = nullptr;
  CUDA_OK(cudaEventCreate(&fork));
  CUDA_OK(cudaEventCreate(&join));
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const std::size_t n = 20000;  // 80 KB: above the eager limits
  float* pinned = nullptr;
  CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * 4));
  DeviceArray<float> x(n), sum(n), from_left(n), direct(std::vector<float>(n, 1.0f));
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaMemcpyAsync(x.get(), pinned, n * 4, cudaMemcpyHostToDevice, stream_));
  NCCL_OK(ncclAllReduce(x.get(), sum.get(), n, ncclFloat32, ncclSum, comm_, stream_));
  CUDA_OK(cudaEventRecord(fork, stream_));
  CUDA_OK(cudaStreamWaitEvent(other, fork, 0));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(x.get(), n, ncclFloat32, right, comm_, stream_));
  NCCL_OK(ncclRecv(from_left.get(), n, ncclFloat32, left, comm_, other));
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaEventRecord(join, other));
  CUDA_OK(cudaStreamWaitEvent(stream_, join, 0));
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphDestroy(graph));
  for (int launch = 0; launch < 3; ++launch) {
    auto value = [&](int r, std::size_t i) { return input(r, i) + float(launch); };
    std::vector<float> expected_sum(n), expected_left(n);
    for (std::size_t i = 0; i < n; ++i) {
      pinned[i] = value(rank_, i);
      float acc = value(0, i);
      for (int r = 1; r < size_; ++r) acc += value(r, i);
      expected_sum[i] = acc;
      expected_left[i] = value(left, i);
    }
    CUDA_OK(cudaGraphLaunch(exec, stream_));
    NCCL_OK(ncclAllReduce(direct.get(), direct.get(), n, ncclFloat32, ncclSum, comm_, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(sum.download(), expected_sum) << "launch " << launch;
    EXPECT_EQ(from_left.download(), expected_left) << "launch " << launch;
    EXPECT_EQ(direct.download()[n - 1], std::pow(float(size_), float(launch + 1)));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaEventDestroy(fork));
  CUDA_OK(cudaEventDestroy(join));
  CUDA_OK(cudaStreamDestroy(other));
}

// Two ids from different creators, communicators created in the same order everywhere;
// both are destroyed before the stream is synchronised.
TEST_F(NcclEmulation, CommunicatorsFromTwoIds) {
  const ncclUniqueId first = shared_id(0), second = shared_id(size_ - 1);
  ncclComm_t a = nullptr, b = nullptr;
  NCCL_OK(ncclCommInitRank(&a, size_, first, rank_));
  NCCL_OK(ncclCommInitRank(&b, size_, second, size_ - 1 - rank_));  // ranks reversed in b
  std::vector<std::int32_t> one(5, rank_ + 1);
  DeviceArray<std::int32_t> x(one), y(one);
  NCCL_OK(ncclAllReduce(x.get(), x.get(), 5, ncclInt32, ncclSum, a, stream_));
  NCCL_OK(ncclAllReduce(y.get(), y.get(), 5, ncclInt32, ncclMax, b, stream_));
  int rank_in_b = -1;
  NCCL_OK(ncclCommUserRank(b, &rank_in_b));
  EXPECT_EQ(rank_in_b, size_ - 1 - rank_);
  // Destroying a communicator lets its queued operations complete first.
  NCCL_OK(ncclCommDestroy(b));
  NCCL_OK(ncclCommDestroy(a));
  EXPECT_EQ(x.download(), std::vector<std::int32_t>(5, size_ * (size_ + 1) / 2));
  EXPECT_EQ(y.download(), std::vector<std::int32_t>(5, size_));
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
}  // namespace pptrain::nccl_test

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  testing::InitGoogleTest(&argc, argv);
  const int rank = pptrain::nccl_test::world_rank();
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new pptrain::nccl_test::FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS();
  // The job fails when any rank failed.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
