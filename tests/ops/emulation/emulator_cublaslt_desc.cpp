// The emulated cuBLASLt's handles, descriptors and preferences (emulator_cublaslt.hpp):
// attributes are stored after the size check cuBLASLt makes.
#include <cstring>

#include "emulator_cublaslt.hpp"

namespace pptrain_emu::lt {
namespace {

// Copies an attribute value after checking its size, as cuBLASLt does.
template <typename T>
cublasStatus_t set(T& field, const void* buf, std::size_t bytes) {
  if (buf == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new Context;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new MatmulDesc{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t bytes) {
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set(d->compute, buf, bytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set(d->scale, buf, bytes);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set(d->pointer_mode, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(d->trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(d->trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSC: return set(d->trans_c, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(d->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(d->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return set(d->bias_batch_stride, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set(d->aux, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set(d->aux_ld, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return set(d->aux_batch_stride, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set(d->aux_type, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(d->bias_type, buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new MatrixLayout{uint32_t(type), CUBLASLT_ORDER_COL, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, std::size_t bytes) {
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set(l->type, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set(l->order, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set(l->rows, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set(l->cols, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_LD: return set(l->ld, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set(l->batch, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set(l->stride, buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new Preference;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t bytes) {
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return set(p->search_mode, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(p->max_workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set(p->align[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set(p->align[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set(p->align[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set(p->align[3], buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace pptrain_emu::lt
