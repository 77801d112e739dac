// What the emulated NCCL refuses or reports, under mpirun (2 and 4 ranks): rendezvous
// (ungrouped sends to each other never complete, the grouped form does), a collective
// whose count differs on one rank (reported on every rank), a send and receive that
// disagree, calls after an abort, host memory, and creations that cannot complete.
#include <cmath>
#include <cstdlib>

#include "nccl_test_util.hpp"

namespace pptrain::nccl_test {
namespace {

class NcclEmulationFailure : public testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess); }
  void TearDown() override { EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess); }
  const int rank_ = world_rank(), size_ = world_size();
  cudaStream_t stream_ = nullptr;
};

bool contains(const char* text, const std::string& part) {
  return std::string(text).find(part) != std::string::npos;
}

// Pairs (0,1), (2,3) both send first without a group: a send completes only when its
// receive is posted, so neither stream finishes. Then the grouped form does.
TEST_F(NcclEmulationFailure, UngroupedSendsToEachOtherDoNotComplete) {
  SKIP_IF_SYNCHRONOUS();
  ncclComm_t comm = world_comm();
  const int peer = rank_ ^ 1;
  const std::size_t n = 4096;
  DeviceArray<float> out(std::vector<float>(n, static_cast<float>(rank_))), in(n);
  NCCL_OK(ncclSend(out.get(), n, ncclFloat32, peer, comm, stream_));
  NCCL_OK(ncclRecv(in.get(), n, ncclFloat32, peer, comm, stream_));
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(wait_stream(stream_, comm, 1.0, &async), cudaErrorNotReady);
  EXPECT_EQ(async, ncclSuccess);
  // The abort lets the queued operations finish as failed, without touching memory.
  NCCL_OK(ncclCommAbort(comm));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(std::isnan(in.download()[0])) << "the receive buffer was written";
  MPI_Barrier(MPI_COMM_WORLD);

  ncclComm_t fresh = world_comm();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(out.get(), n, ncclFloat32, peer, fresh, stream_));
  NCCL_OK(ncclRecv(in.get(), n, ncclFloat32, peer, fresh, stream_));
  NCCL_OK(ncclGroupEnd());
  EXPECT_EQ(wait_stream(stream_, fresh, 30.0), cudaSuccess);
  EXPECT_EQ(in.download(), std::vector<float>(n, static_cast<float>(peer)));
  NCCL_OK(ncclCommDestroy(fresh));
}

// The last rank calls the all-reduce with another count: every rank's communicator gets
// ncclInvalidUsage with a message naming both calls, and the operation never completes.
TEST_F(NcclEmulationFailure, MismatchedCollectiveIsReportedOnEveryRank) {
  SKIP_IF_SYNCHRONOUS();
  ncclComm_t comm = world_comm();
  const std::size_t n = rank_ == size_ - 1 ? 65 : 64;
  DeviceArray<float> buf(std::vector<float>(65, 1.0f));
  NCCL_OK(ncclAllReduce(buf.get(), buf.get(), n, ncclFloat32, ncclSum, comm, stream_));
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(wait_stream(stream_, comm, 30.0, &async), cudaErrorNotReady);
  EXPECT_EQ(async, ncclInvalidUsage);
  const char* text = ncclGetLastError(nullptr);
  EXPECT_TRUE(contains(text, "differs between ranks")) << text;
  EXPECT_TRUE(contains(text, "ncclAllReduce(count 64, float32, sum)")) << text;
  EXPECT_TRUE(contains(text, "ncclAllReduce(count 65, float32, sum)")) << text;
  // A call on a communicator with an error fails too.
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 64, ncclFloat32, ncclSum, comm, stream_),
            ncclInvalidUsage);
  NCCL_OK(ncclCommAbort(comm));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(buf.download(), std::vector<float>(65, 1.0f));
  MPI_Barrier(MPI_COMM_WORLD);
}

// A receive whose count differs from its send: both ranks of the pair report it.
TEST_F(NcclEmulationFailure, MismatchedSendAndReceiveAreReported) {
  SKIP_IF_SYNCHRONOUS();
  ncclComm_t comm = world_comm();
  const int peer = rank_ ^ 1;
  DeviceArray<float> buf(std::vector<float>(8, 2.0f));
  if (rank_ % 2 == 0) {
    NCCL_OK(ncclSend(buf.get(), 8, ncclFloat32, peer, comm, stream_));
  } else {
    NCCL_OK(ncclRecv(buf.get(), 4, ncclFloat32, peer, comm, stream_));
  }
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(wait_stream(stream_, comm, 30.0, &async), cudaErrorNotReady);
  EXPECT_EQ(async, ncclInvalidUsage);
  const char* text = ncclGetLastError(nullptr);
  EXPECT_TRUE(contains(text, "(count 8, float32) does not match")) << text;
  EXPECT_TRUE(contains(text, "(count 4, float32)")) << text;
  NCCL_OK(ncclCommAbort(comm));
  CUDA_OK(cudaStreamSynchronize(stream_));
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(NcclEmulationFailure, EveryCallFailsAfterAbort) {
  ncclComm_t comm = world_comm();
  NCCL_OK(ncclCommAbort(comm));
  DeviceArray<float> buf(16);
  int value = 0;
  ncclResult_t async = ncclSuccess;
  EXPECT_NE(ncclAllReduce(buf.get(), buf.get(), 16, ncclFloat32, ncclSum, comm, stream_),
            ncclSuccess);
  EXPECT_TRUE(contains(ncclGetLastError(nullptr), "has been aborted")) << ncclGetLastError(nullptr);
  EXPECT_NE(ncclSend(buf.get(), 16, ncclFloat32, 0, comm, stream_), ncclSuccess);
  EXPECT_NE(ncclRecv(buf.get(), 16, ncclFloat32, 0, comm, stream_), ncclSuccess);
  EXPECT_NE(ncclBroadcast(buf.get(), buf.get(), 16, ncclFloat32, 0, comm, stream_), ncclSuccess);
  EXPECT_NE(ncclCommCount(comm, &value), ncclSuccess);
  EXPECT_NE(ncclCommUserRank(comm, &value), ncclSuccess);
  EXPECT_NE(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_NE(async, ncclSuccess);
  EXPECT_NE(ncclCommAbort(comm), ncclSuccess);
  EXPECT_NE(ncclCommDestroy(comm), ncclSuccess);
  CUDA_OK(cudaStreamSynchronize(stream_));
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(NcclEmulationFailure, HostOrOverrunningBuffersAreRefused) {
  ncclComm_t comm = world_comm();
  std::vector<float> host(64, 1.0f);
  DeviceArray<float> dev(64);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 64, ncclFloat32, ncclSum, comm, stream_),
            ncclInvalidArgument);
  EXPECT_TRUE(contains(ncclGetLastError(nullptr), "not inside one device allocation"))
      << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclAllReduce(dev.get(), host.data(), 64, ncclFloat32, ncclSum, comm, stream_),
            ncclInvalidArgument);
  EXPECT_TRUE(contains(ncclGetLastError(nullptr), "recvbuff")) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclSend(dev.get(), 65, ncclFloat32, 0, comm, stream_), ncclInvalidArgument);
  EXPECT_EQ(ncclAllGather(dev.get(), dev.get(), 64, ncclFloat32, comm, stream_),
            ncclInvalidArgument);  // recvbuff holds only one rank's block
  // A refused call inside a group fails the group; nothing of it is queued.
  NCCL_OK(ncclGroupStart());
  EXPECT_EQ(ncclRecv(host.data(), 64, ncclFloat32, 0, comm, stream_), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  // Nothing was queued, so the communicator still works.
  NCCL_OK(ncclAllReduce(dev.get(), dev.get(), 0, ncclFloat32, ncclSum, comm, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  NCCL_OK(ncclCommDestroy(comm));
}

// Creations that cannot complete fail after the timeout, naming the missing ranks.
class ShortInitTimeout : public NcclEmulationFailure {
 protected:
  void SetUp() override {
    NcclEmulationFailure::SetUp();
    setenv("PPTRAIN_EMULATED_NCCL_INIT_TIMEOUT_S", "1", 1);
  }
  void TearDown() override {
    unsetenv("PPTRAIN_EMULATED_NCCL_INIT_TIMEOUT_S");
    MPI_Barrier(MPI_COMM_WORLD);
    NcclEmulationFailure::TearDown();
  }
};

TEST_F(ShortInitTimeout, MissingRankIsNamed) {
  const ncclUniqueId id = shared_id(0);
  if (rank_ == size_ - 1) return;  // never joins
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, size_, id, rank_), ncclInvalidUsage);
  const char* text = ncclGetLastError(nullptr);
  EXPECT_TRUE(contains(text, "missing ranks: " + std::to_string(size_ - 1))) << text;
  EXPECT_TRUE(contains(text, "communicator 0.")) << text;
  EXPECT_EQ(comm, nullptr);
}

// Rank 1 creates its communicators in the other order: both creations fail, each naming
// the ranks it waited for.
TEST_F(ShortInitTimeout, CreationInDifferentOrdersFails) {
  const ncclUniqueId x = shared_id(0), y = shared_id(1);
  ncclComm_t comm = nullptr;
  const ncclUniqueId& first = rank_ == 1 ? y : x;
  EXPECT_EQ(ncclCommInitRank(&comm, size_, first, rank_), ncclInvalidUsage);
  const char* text = ncclGetLastError(nullptr);
  EXPECT_TRUE(contains(text, rank_ == 1 ? "missing ranks: 0" : "missing ranks: 1")) << text;
}

}  // namespace
}  // namespace pptrain::nccl_test
