// The emulated cuBLASLt's descriptors (include/cublasLt.h; emulator_cublaslt.cpp runs
// the products, emulator_cublaslt_desc.cpp creates and sets the descriptors).
#pragma once
#include <cublasLt.h>

#include <cstdint>

namespace pptrain_emu::lt {

struct Context {};
struct MatmulDesc {
  int32_t compute, scale, pointer_mode = 0, trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N,
                          trans_c = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t bias_batch_stride = 0, aux_ld = 0, aux_batch_stride = 0;
  int32_t bias_type = -1, aux_type = -1;
};
struct MatrixLayout {
  uint32_t type;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct Preference {
  uint64_t max_workspace = 0;
  uint32_t search_mode = 0, align[4] = {256, 256, 256, 256};  // cuBLASLt's defaults
};

}  // namespace pptrain_emu::lt
