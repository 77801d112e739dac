// One check macro for the CUDA runtime's and cuBLASLt's status codes (cudaError_t,
// cublasStatus_t); NCCL's go through NcclContext::check in lib/comm, which also aborts
// the communicators. A failure throws
// std::runtime_error naming the statement, the library's error string, file:line and
// the host, through one out-of-line [[noreturn]] handler.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

namespace pptrain::cuda_check {

inline bool is_ok(cudaError_t e) { return e == cudaSuccess; }
inline const char* error_string(cudaError_t e) { return cudaGetErrorString(e); }
inline bool is_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline const char* error_string(cublasStatus_t s) { return cublasLtGetStatusString(s); }

// Throws std::runtime_error("<file>:<line> on <host>: <what> failed: <error>").
[[noreturn]] void cuda_failure(const char* what, const char* error, const char* file, int line);

}  // namespace pptrain::cuda_check

#define PPTRAIN_CUDA_CHECK(expr)                                                                 \
  do {                                                                                           \
    const auto pptrain_cuda_status_ = (expr);                                                    \
    if (!::pptrain::cuda_check::is_ok(pptrain_cuda_status_))                                     \
      ::pptrain::cuda_check::cuda_failure(                                                       \
          #expr, ::pptrain::cuda_check::error_string(pptrain_cuda_status_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports a bad launch configuration (asynchronous faults
// surface at the next synchronising call).
#define PPTRAIN_CUDA_CHECK_LAUNCH() PPTRAIN_CUDA_CHECK(cudaGetLastError())
