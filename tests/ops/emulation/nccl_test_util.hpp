// Helpers for the emulated NCCL's tests (run under mpirun): the world, communicators
// made from an id broadcast over MPI, device arrays, bf16 bits, and waiting on a stream
// while watching a communicator's asynchronous error.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace pptrain::nccl_test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

#define NCCL_OK(call) ASSERT_EQ((call), ncclSuccess) << ncclGetLastError(nullptr)
#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess)

// An id made by world rank `creator` and broadcast to every rank.
inline ncclUniqueId shared_id(int creator = 0) {
  ncclUniqueId id{};
  if (world_rank() == creator) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, creator, MPI_COMM_WORLD);
  return id;
}

// A communicator of every world rank, NCCL rank = world rank.
inline ncclComm_t world_comm(int creator = 0) {
  ncclComm_t comm = nullptr;
  const ncclUniqueId id = shared_id(creator);
  EXPECT_EQ(ncclCommInitRank(&comm, world_size(), id, world_rank()), ncclSuccess)
      << ncclGetLastError(nullptr);
  return comm;
}

// An array in emulated device memory.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), cudaSuccess);
  }
  explicit DeviceArray(const std::vector<T>& v) : DeviceArray(v.size()) { upload(v); }
  ~DeviceArray() { (void)cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

// Deterministic inputs of rank r that make rounding matter: mixed magnitudes and signs.
inline float input(int r, std::size_t i) {
  const auto k = static_cast<std::uint32_t>(i * 2654435761u + static_cast<unsigned>(r) * 40503u);
  const float mantissa = 1.0f + static_cast<float>(k % 8191u) / 8191.0f;
  const float scale = static_cast<float>(1u << ((k >> 13) % 12u)) / 64.0f;
  return ((k >> 20) & 1u ? -mantissa : mantissa) * scale;
}

inline std::uint16_t bf16_bits(float f) { return pptrain_emu::bf16_bits_rn(f); }
inline float bf16_value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// True when the emulated streams run every item as it is queued
// (PPTRAIN_EMULATED_STREAM_SEED=sync): an operation that waits for a peer then blocks its
// call, so the tests that leave operations waiting cannot run.
inline bool streams_synchronous() {
  const char* setting = std::getenv("PPTRAIN_EMULATED_STREAM_SEED");
  return setting != nullptr && std::string(setting) == "sync";
}
#define SKIP_IF_SYNCHRONOUS()                                                           \
  if (streams_synchronous())                                                            \
  GTEST_SKIP() << "needs asynchronous streams: PPTRAIN_EMULATED_STREAM_SEED=sync runs " \
                  "each operation as it is queued"

// Polls the stream (which progresses its work) until it is done, the communicator has an
// asynchronous error, or `seconds` pass; returns the last cudaStreamQuery result.
inline cudaError_t wait_stream(cudaStream_t s, ncclComm_t comm, double seconds,
                               ncclResult_t* async = nullptr) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  cudaError_t state = cudaErrorNotReady;
  while (std::chrono::steady_clock::now() < end) {
    state = cudaStreamQuery(s);
    ncclResult_t err = ncclSuccess;
    if (comm != nullptr) ncclCommGetAsyncError(comm, &err);
    if (async != nullptr) *async = err;
    if (state != cudaErrorNotReady || err != ncclSuccess) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

}  // namespace pptrain::nccl_test
