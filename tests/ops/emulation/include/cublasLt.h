// The CUDA emulator's stand-in for the toolkit header: only the status type and its
// string, which ops/cuda/cuda_check.hpp names.
#pragma once
#include "cuda_emulator.hpp"

enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
static inline const char* cublasLtGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}
