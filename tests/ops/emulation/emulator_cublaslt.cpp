// cuBLASLt on the CPU (include/cublasLt.h), written from the library's documentation:
// matrices are column-major; a layout describes a matrix as stored (rows x cols before
// the transpose); D[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C[m x n], with m, n
// the rows and cols of D and C is not read when beta is 0; batches repeat at
// STRIDED_BATCH_OFFSET elements. Epilogues: BIAS adds bias[row] (length = rows of D,
// same type as D unless set), GELU applies the tanh form, *_AUX stores the value before
// GELU (after the bias) at AUX_LD (a multiple of 8, at least the rows of D). Sums are in
// fp64, results round once to the stored type. Checked, as cuBLASLt would refuse them:
// attribute sizes, layout shapes against the transposes and each other, batch counts,
// type combinations; the algorithm must come from the heuristic for the same shapes,
// and the pointers must be as aligned as the preference promised. Reads and writes
// that leave a device allocation fail with CUBLAS_STATUS_EXECUTION_FAILED (a fault).
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

namespace {

constexpr uint64_t kAlgoMagic = 0x456d754c74416c67ull;

// Copies an attribute value after checking its size, as cuBLASLt does.
template <typename T>
cublasStatus_t set(T& field, const void* buf, std::size_t bytes) {
  if (buf == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

bool has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                                   e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool has_gelu(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                                   e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool has_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
std::size_t type_size(int32_t t) { return t == CUDA_R_32F ? 4 : 2; }
bool real_type(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

// The problem's shapes, or why cuBLASLt would refuse it.
struct Shape {
  uint64_t m, n, k;
  int32_t batch;
};
cublasStatus_t check(const MatmulDesc& d, const MatrixLayout& A, const MatrixLayout& B,
                     const MatrixLayout& C, const MatrixLayout& D, Shape& s) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F || d.pointer_mode != 0)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (const MatrixLayout* l : {&A, &B, &C, &D}) {
    if (l->order != CUBLASLT_ORDER_COL) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->ld < int64_t(std::max<uint64_t>(1, l->rows)) || l->batch < 1 || l->stride < 0)
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  const auto op_ok = [](int32_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T; };
  if (!op_ok(d.trans_a) || !op_ok(d.trans_b) || d.trans_c != CUBLAS_OP_N)
    return CUBLAS_STATUS_INVALID_VALUE;
  s.m = D.rows, s.n = D.cols, s.batch = D.batch;
  const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
  s.k = ta ? A.rows : A.cols;
  if ((ta ? A.cols : A.rows) != s.m || (tb ? B.cols : B.rows) != s.k ||
      (tb ? B.rows : B.cols) != s.n || C.rows != s.m || C.cols != s.n)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (A.batch != s.batch || B.batch != s.batch || C.batch != s.batch)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (A.type != B.type || C.type != D.type || !real_type(A.type) || !real_type(D.type) ||
      (A.type == CUDA_R_32F && D.type != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint32_t e = d.epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && !has_bias(e) && !has_gelu(e))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (has_bias(e) && d.bias_type != -1 && !real_type(d.bias_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (has_aux(e)) {
    if (d.aux_type != -1 && !real_type(d.aux_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.aux_ld < int64_t(s.m) || d.aux_ld % 8 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (s.batch > 1 && (d.aux_batch_stride == 0 || d.aux_batch_stride % 8 != 0))
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return a == 0 ? 256u : std::min<uint32_t>(256u, uint32_t(a & (~a + 1)));
}

// Bytes spanned by `batch` matrices of rows x cols at ld, stride (elements).
std::size_t extent(uint64_t rows, uint64_t cols, int64_t ld, int32_t batch, int64_t stride,
                   std::size_t elem) {
  if (rows == 0 || cols == 0) return 0;
  return (std::size_t(batch - 1) * stride + (cols - 1) * ld + rows) * elem;
}

float load(const void* p, int32_t type, std::size_t i) {
  if (type == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return float(static_cast<const BFloat16*>(p)[i]);
}
void store(void* p, int32_t type, std::size_t i, float v) {
  if (type == CUDA_R_32F)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<BFloat16*>(p)[i] = BFloat16(v);
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

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  if (returned) *returned = 0;
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !a || !b || !c || !d || !pref || requested < 1 || !results || !returned)
    return CUBLAS_STATUS_INVALID_VALUE;
  Shape s{};
  if (const cublasStatus_t st = check(*desc, *a, *b, *c, *d, s); st != CUBLAS_STATUS_SUCCESS)
    return st;
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = kAlgoMagic;
  r.algo.data[1] = s.m, r.algo.data[2] = s.n, r.algo.data[3] = s.k;
  r.algo.data[4] = uint64_t(pref->align[0]) | uint64_t(pref->align[1]) << 16 |
                   uint64_t(pref->align[2]) << 32 | uint64_t(pref->align[3]) << 48;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha_p,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta_p, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void*, std::size_t,
                              cudaStream_t stream) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !a || !b || !c || !d || !alpha_p || !beta_p || !algo)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (stream_check(stream) != cudaSuccess) return CUBLAS_STATUS_INVALID_VALUE;
  Shape s{};
  if (const cublasStatus_t st = check(*desc, *a, *b, *c, *d, s); st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (algo->data[0] != kAlgoMagic || algo->data[1] != s.m || algo->data[2] != s.n ||
      algo->data[3] != s.k)
    return CUBLAS_STATUS_INVALID_VALUE;  // not the heuristic's algorithm for this problem
  const void* ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i)
    if (alignment(ptrs[i]) < uint32_t(algo->data[4] >> (16 * i) & 0xFFFF))
      return CUBLAS_STATUS_INVALID_VALUE;  // less aligned than the algorithm was chosen for
  const float alpha = *static_cast<const float*>(alpha_p);
  const float beta = *static_cast<const float*>(beta_p);
  const uint32_t e = desc->epilogue;
  if ((has_bias(e) && desc->bias == nullptr) || (has_aux(e) && desc->aux == nullptr) ||
      A == nullptr || B == nullptr || D == nullptr || (beta != 0.0f && C == nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (C == D && (c->ld != d->ld || c->type != d->type || c->stride != d->stride))
    return CUBLAS_STATUS_INVALID_VALUE;  // in place needs one layout
  const int32_t bias_type = desc->bias_type == -1 ? int32_t(d->type) : desc->bias_type;
  const int32_t aux_type = desc->aux_type == -1 ? int32_t(d->type) : desc->aux_type;
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  // Every array must lie inside its device allocation (or be host memory).
  const auto inside = [](const void* p, std::size_t bytes) { return device_range_ok(p, bytes); };
  if (!inside(A, extent(a->rows, a->cols, a->ld, s.batch, a->stride, type_size(a->type))) ||
      !inside(B, extent(b->rows, b->cols, b->ld, s.batch, b->stride, type_size(b->type))) ||
      (beta != 0.0f &&
       !inside(C, extent(c->rows, c->cols, c->ld, s.batch, c->stride, type_size(c->type)))) ||
      !inside(D, extent(d->rows, d->cols, d->ld, s.batch, d->stride, type_size(d->type))) ||
      (has_bias(e) && !inside(desc->bias, extent(s.m, 1, int64_t(s.m), s.batch,
                                                 desc->bias_batch_stride, type_size(bias_type)))) ||
      (has_aux(e) && !inside(desc->aux, extent(s.m, s.n, desc->aux_ld, s.batch,
                                               desc->aux_batch_stride, type_size(aux_type)))))
    return CUBLAS_STATUS_EXECUTION_FAILED;

  for (int32_t batch = 0; batch < s.batch; ++batch) {
    const std::size_t oa = std::size_t(batch) * a->stride, ob = std::size_t(batch) * b->stride,
                      oc = std::size_t(batch) * c->stride, od = std::size_t(batch) * d->stride;
    for (uint64_t j = 0; j < s.n; ++j)
      for (uint64_t i = 0; i < s.m; ++i) {
        double acc = 0.0;
        for (uint64_t k = 0; k < s.k; ++k) {
          const float x = load(A, a->type, oa + (ta ? k + i * a->ld : i + k * a->ld));
          const float y = load(B, b->type, ob + (tb ? j + k * b->ld : k + j * b->ld));
          acc += double(x) * double(y);
        }
        double r = double(alpha) * acc;
        if (beta != 0.0f) r += double(beta) * load(C, c->type, oc + i + j * c->ld);
        if (has_bias(e))
          r += load(desc->bias, bias_type, std::size_t(batch) * desc->bias_batch_stride + i);
        const float pre = float(r);
        if (has_aux(e))
          store(desc->aux, aux_type,
                std::size_t(batch) * desc->aux_batch_stride + i + j * desc->aux_ld, pre);
        float out = pre;
        if (has_gelu(e)) {
          const double x = pre;
          out = float(0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))));
        }
        store(D, d->type, od + i + j * d->ld, out);
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace pptrain_emu::lt
