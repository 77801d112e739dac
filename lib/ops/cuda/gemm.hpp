// Matrix products through cuBLASLt for row-major arrays: plain, strided batched, with a
// fused bias, bias+GELU or GELU-gradient epilogue, and mixed bf16-in/fp32-out for weight
// gradients, which may also sum their output gradient's columns (the bias gradient).
// Every distinct problem (shape, transposes, batch, dtypes, epilogue, pointer
// alignments) gets one plan: the matmul descriptor, four layout descriptors and the
// heuristic's algorithm, built on first use and reused by every later call. Compute
// is always fp32 (CUBLAS_COMPUTE_32F, no TF32), so fp32 arrays get fp32 products.
// Not thread-safe: one Gemm serves one stream's caller.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/dtype.hpp"
#include "ops/cuda/cuda_raii.hpp"
#include "ops/ops.hpp"

namespace pptrain::ops::cuda {

enum class Epilogue : uint8_t {
  kNone,
  kBias,         // D = alpha * op(A) op(B) + beta * C + bias (bias[N], broadcast over rows)
  kGeluAuxBias,  // aux = op(A) op(B) + bias; D = gelu(aux) (tanh form); beta must be 0
  kDGelu,        // D = alpha * op(A) op(B) * gelu'(aux) (aux: the GELU's input); beta 0
  kBGrad,        // as kNone, and bias[N] = sum over K of op(B) (written, D's type)
};

// One product in row-major terms: C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
// A is stored [M,K] ([K,M] when trans_a), B [K,N] ([N,K] when trans_b), C [M,N], all
// densely packed. With batch > 1 the matrices repeat `batch` times at the given strides
// (elements). A and B hold `ab` elements; C, D, bias and aux hold `cd` elements.
struct GemmProblem {
  bool trans_a = false;
  bool trans_b = false;
  int M = 0, N = 0, K = 0;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  DType ab = DType::F32;
  DType cd = DType::F32;
  Epilogue epilogue = Epilogue::kNone;
  bool accumulate = false;  // beta != 0 (C is read)

  std::string describe() const;
  auto operator<=>(const GemmProblem&) const = default;
};

// Device pointers of one call. D is written in place of C (same layout), or to d when
// it is not null (C then only read, with beta != 0).
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;  // kBias, kGeluAuxBias: [N] of dtype cd; kBGrad: written
  // kGeluAuxBias (written) and kDGelu (read): [M,N] of dtype cd, the GELU's input.
  const void* aux = nullptr;
  void* d = nullptr;
};

class Gemm {
 public:
  // A handle and a workspace on the current device.
  explicit Gemm(std::size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Queues the product on `stream`; throws std::runtime_error naming the problem
  // when cuBLASLt has no algorithm for it.
  void run(const GemmProblem& p, float alpha, const GemmOperands& x, float beta,
           cudaStream_t stream);
  // As run(), but returns false (queuing nothing) when there is no algorithm; the first
  // time for a problem with an epilogue it logs which product falls back.
  bool try_run(const GemmProblem& p, float alpha, const GemmOperands& x, float beta,
               cudaStream_t stream);

  // Number of cached plans (one per distinct problem seen, with or without algorithm).
  std::size_t cache_size() const { return plans_.size(); }
  std::size_t workspace_bytes() const { return workspace_.bytes(); }

  static constexpr std::size_t kDefaultWorkspaceBytes = kCudaGemmWorkspaceBytes;  // ops.hpp

 private:
  struct Plan;
  // The problem plus the alignment (bytes, up to 256) of each pointer: cuBLASLt picks
  // algorithms that rely on the alignment it is shown.
  struct Key {
    GemmProblem p;
    uint32_t align_a, align_b, align_c, align_bias, align_aux, align_d;
    auto operator<=>(const Key&) const = default;
  };

  static Key key_of(const GemmProblem& p, const GemmOperands& x);
  std::unique_ptr<Plan> make_plan(const Key& key, const GemmOperands& x) const;

  CublasLtHandle handle_;
  DeviceMemory workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace pptrain::ops::cuda
