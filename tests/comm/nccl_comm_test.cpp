// NCCL communicators on one rank (a singleton MPI job, no mpirun) and one GPU: every
// collective leaves its values as they are or copies them, the exchange to self moves
// them by tag, and the communicators are destroyed and made again. Skipped without a
// CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "comm/comm.hpp"
#include "comm/nccl_comm.hpp"

namespace pptrain::comm {
namespace {

constexpr double kTimeout = 20;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclBuild, IsBuilt) { EXPECT_TRUE(nccl_built()); }

// A device copy of a host array, freed on destruction.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return n_ * sizeof(T); }
  // The values once `stream` has finished.
  std::vector<T> read(cudaStream_t stream) const {
    std::vector<T> out(n_);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t n_;
};

class NcclOneRank : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_device()) return;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    comms_ = std::make_unique<Comms>(make_mpi_comms(grid(), kTimeout));
    add_nccl_comms(*comms_, grid(), stream_);
  }
  static void TearDownTestSuite() {
    comms_.reset();  // NCCL first, then MPI (finalized: this process holds no session)
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    ASSERT_TRUE(comms_ && comms_->device);
  }

  static RankGrid grid() { return RankGrid(1, 1, 1); }
  static DeviceComms& dev() { return *comms_->device; }
  static std::vector<Group*> groups() {
    return {dev().tp.get(), dev().dp.get(), dev().embedding.get()};
  }

  static inline std::unique_ptr<Comms> comms_;
  static inline cudaStream_t stream_ = nullptr;
};

const std::vector<float> kValues = {1.5f, -2.0f, 3.0e7f, 0.0f, 0.125f, -7.75f};

TEST_F(NcclOneRank, GroupsMirrorTheHostGroups) {
  ASSERT_NE(dev().embedding, nullptr);
  const Group* host[] = {comms_->tp.get(), comms_->dp.get(), comms_->embedding.get()};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(groups()[i]->name(), host[i]->name());
    EXPECT_EQ(groups()[i]->rank(), 0);
    EXPECT_EQ(groups()[i]->size(), 1);
    EXPECT_EQ(groups()[i]->world_ranks(), std::vector<int>{0});
  }
  EXPECT_EQ(dev().world->rank(), 0);
  EXPECT_EQ(dev().world->size(), 1);
  EXPECT_EQ(&comms_->world_for_model(), dev().world.get());
  EXPECT_EQ(comms_->tp_for_model(), dev().tp.get());
}

TEST_F(NcclOneRank, AllReduceKeepsValuesOnOneRank) {
  for (Group* g : groups()) {
    DeviceArray<float> a(kValues);
    g->all_reduce(a.get(), kValues.size(), ReduceOp::Sum);
    g->all_reduce(a.get(), kValues.size(), ReduceOp::Max);
    g->all_reduce(static_cast<void*>(a.get()), kValues.size(), DType::F32);
    g->all_reduce(a.get(), 0, ReduceOp::Sum);
    EXPECT_EQ(a.read(stream_), kValues) << g->name();
  }
}

TEST_F(NcclOneRank, AllReduceBf16KeepsBits) {
  // bf16 1, 2, -0.5, 0, 3.140625, the largest finite value
  const std::vector<uint16_t> bits = {0x3F80, 0x4000, 0xBF00, 0x0000, 0x4049, 0x7F7F};
  DeviceArray<uint16_t> a(bits);
  dev().tp->all_reduce(static_cast<void*>(a.get()), bits.size(), DType::BF16);
  EXPECT_EQ(a.read(stream_), bits);
}

TEST_F(NcclOneRank, ReduceScatterAndAllGatherBf16KeepBits) {
  const std::vector<uint16_t> bits = {0x3F80, 0x4000, 0xBF00, 0x0000, 0x4049, 0x7F7F};
  DeviceArray<uint16_t> src(bits), dst(std::vector<uint16_t>(bits.size(), 0)),
      gathered(std::vector<uint16_t>(bits.size(), 0));
  dev().tp->reduce_scatter(src.get(), dst.get(), bits.size(), DType::BF16);
  EXPECT_EQ(dst.read(stream_), bits);
  dev().tp->all_gather(src.get(), gathered.get(), bits.size(), DType::BF16);
  EXPECT_EQ(gathered.read(stream_), bits);
}

TEST_F(NcclOneRank, AllReduceDoublesInDeviceMemory) {
  const std::vector<double> values{1.5, -2.25, 1e300};
  DeviceArray<double> d(values);
  dev().dp->all_reduce(d.get(), values.size(), ReduceOp::Sum);
  dev().pp->all_reduce(d.get(), values.size(), ReduceOp::Max);
  EXPECT_EQ(d.read(stream_), values);
}

TEST_F(NcclOneRank, ReduceScatterAndAllGatherCopyOnOneRank) {
  const std::size_t n = kValues.size();
  DeviceArray<float> src(kValues), dst(std::vector<float>(n, 9.0f)), gathered(std::vector<float>(n, 9.0f));
  dev().tp->reduce_scatter(src.get(), dst.get(), n);
  EXPECT_EQ(dst.read(stream_), kValues);
  dev().tp->all_gather(src.get(), gathered.get(), n);
  EXPECT_EQ(gathered.read(stream_), kValues);
  // In place: nothing moves.
  dev().tp->reduce_scatter(dst.get(), dst.get(), n);
  dev().tp->all_gather(dst.get(), dst.get(), n);
  EXPECT_EQ(dst.read(stream_), kValues);
}

TEST_F(NcclOneRank, CollectivesFollowTheComputeStream) {
  // The input is written by a copy queued on the compute stream just before.
  const std::size_t n = kValues.size();
  DeviceArray<float> src(kValues), a(std::vector<float>(n, 0.0f)), out(std::vector<float>(n, 0.0f));
  ASSERT_EQ(cudaMemcpyAsync(a.get(), src.get(), src.bytes(), cudaMemcpyDeviceToDevice, stream_),
            cudaSuccess);
  dev().dp->all_gather(a.get(), out.get(), n);
  EXPECT_EQ(out.read(stream_), kValues);
}

TEST_F(NcclOneRank, Broadcast) {
  DeviceArray<float> a(kValues);
  dev().embedding->broadcast(a.get(), kValues.size(), 0);
  EXPECT_EQ(a.read(stream_), kValues);
  EXPECT_THROW(dev().embedding->broadcast(a.get(), kValues.size(), 1), std::logic_error);
}

TEST_F(NcclOneRank, InPlaceBucketCollectivesKeepTheValues) {
  const std::size_t n = kValues.size();
  DeviceArray<float> src(kValues), a(std::vector<float>(n, 0.0f));
  ASSERT_EQ(cudaMemcpyAsync(a.get(), src.get(), src.bytes(), cudaMemcpyDeviceToDevice, stream_),
            cudaSuccess);
  auto rs = dev().dp->reduce_scatter_start(a.get(), n);
  rs->wait_in_queue();
  auto ag = dev().dp->all_gather_start(a.get(), n);
  ag->wait_in_queue();
  EXPECT_EQ(a.read(stream_), kValues);
}

TEST_F(NcclOneRank, AllReduceStartWaitsOnTheSideStream) {
  const std::size_t n = kValues.size();
  DeviceArray<float> src(kValues), a(std::vector<float>(n, 0.0f));
  ASSERT_EQ(cudaMemcpyAsync(a.get(), src.get(), src.bytes(), cudaMemcpyDeviceToDevice, stream_),
            cudaSuccess);
  auto op = dev().dp->all_reduce_start(a.get(), n);
  op->wait();
  EXPECT_TRUE(op->test());
  op->wait();  // twice is harmless
  EXPECT_EQ(a.read(stream_), kValues);
  auto never_waited = dev().dp->all_reduce_start(a.get(), n);  // waited on destruction
}

TEST_F(NcclOneRank, ExchangeWithSelfMatchesByTag) {
  const std::vector<float> first = {1, 2, 3}, second = {4, 5, 6, 7};
  DeviceArray<float> a(first), b(second), x(std::vector<float>(3, 0.0f)),
      y(std::vector<float>(4, 0.0f));
  // Sends and receives listed in different tag orders.
  dev().world->exchange({{Transfer::Send, 0, a.get(), a.bytes(), 5},
                         {Transfer::Send, 0, b.get(), b.bytes(), 2},
                         {Transfer::Recv, 0, y.get(), y.bytes(), 2},
                         {Transfer::Recv, 0, x.get(), x.bytes(), 5}});
  EXPECT_EQ(x.read(stream_), first);
  EXPECT_EQ(y.read(stream_), second);

  DeviceArray<float> z(std::vector<float>(3, 0.0f));
  auto op = dev().world->exchange_start({{Transfer::Recv, 0, z.get(), z.bytes(), 0},
                                         {Transfer::Send, 0, a.get(), a.bytes(), 0}});
  op->wait();
  EXPECT_TRUE(op->test());
  EXPECT_EQ(z.read(stream_), first);
  dev().world->exchange({});
  dev().world->barrier();
}

TEST_F(NcclOneRank, BadTransfersAreRefused) {
  float f = 0;
  EXPECT_THROW(dev().world->exchange({{Transfer::Send, 1, &f, 4, 0}}), std::logic_error);
  EXPECT_THROW(dev().world->exchange({{Transfer::Send, 0, nullptr, 4, 0}}), std::logic_error);
}

TEST_F(NcclOneRank, DestroyAndMakeAgain) {
  comms_->device.reset();
  add_nccl_comms(*comms_, grid(), stream_);
  ASSERT_TRUE(comms_->device);
  DeviceArray<float> a(kValues);
  dev().tp->all_reduce(a.get(), kValues.size(), ReduceOp::Sum);
  EXPECT_EQ(a.read(stream_), kValues);
  EXPECT_THROW(add_nccl_comms(*comms_, grid(), stream_), std::logic_error);  // already made
}

}  // namespace
}  // namespace pptrain::comm
