// cuBLASLt's products on the CPU (include/cublasLt.h), written from the library's documentation:
// matrices are column-major; a layout describes a matrix as stored (rows x cols before
// the transpose); D[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C[m x n], with m, n
// the rows and cols of D and C is not read when beta is 0; batches repeat at
// STRIDED_BATCH_OFFSET elements. Epilogues: BIAS adds bias[row] (length = rows of D,
// same type as D unless set), GELU applies the tanh form, *_AUX stores the value before
// GELU (after the bias) at AUX_LD (a multiple of 8, at least the rows of D); BGRADA writes
// to the bias pointer the sums of op(A) over k (length = rows of D, D's type unless set),
// unscaled, single products only (BGRADB, op(B)'s, is not used and not emulated). Sums are in
// fp64, results round once to the stored type. Checked, as cuBLASLt would refuse them:
// attribute sizes, layout shapes against the transposes and each other, batch counts,
// type combinations; the algorithm must come from the heuristic for the same shapes,
// and the pointers must be as aligned as the preference promised. Reads and writes
// that leave a device allocation fail with CUBLAS_STATUS_EXECUTION_FAILED (a fault).
// All of that is checked, and alpha, beta and the descriptors read, when cublasLtMatmul
// is called; the product is computed when its stream's work is due (emulator_streams.hpp).
#include "emulator_cublaslt.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "emulator_counters.hpp"
#include "emulator_races.hpp"
#include "emulator_streams.hpp"

namespace pptrain_emu::lt {

namespace {

constexpr uint64_t kAlgoMagic = 0x456d754c74416c67ull;

bool has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                                   e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool has_gelu(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                                   e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
// GELU_AUX* write the GELU's input to aux; DGELU reads it (the forward's aux) and scales
// the product by the GELU's derivative there.
bool writes_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool is_dgelu(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU; }
bool has_aux(uint32_t e) { return writes_aux(e) || is_dgelu(e); }
bool is_bgrad(uint32_t e) { return e == CUBLASLT_EPILOGUE_BGRADA; }
// The epilogues that use the bias pointer: read, or written by BGRADA.
bool uses_bias(uint32_t e) { return has_bias(e) || is_bgrad(e); }
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
  if (e != CUBLASLT_EPILOGUE_DEFAULT && !has_bias(e) && !has_gelu(e) && !is_dgelu(e) &&
      !is_bgrad(e))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (uses_bias(e) && d.bias_type != -1 && !real_type(d.bias_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (is_bgrad(e) && s.batch > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
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

// One checked product, with copies of what it reads from the descriptors.
struct Product {
  MatmulDesc desc;
  MatrixLayout a, b, c, d;
  Shape s;
  float alpha, beta;
  const void *A, *B, *C;
  void* D;
  int32_t bias_type, aux_type;
};

// Tells the race detector about `batch` stored matrices of rows x cols (column-major at
// ld, batches `stride` elements apart), column by column; returns their bytes.
unsigned long long note_matrix(const void* p, uint64_t rows, uint64_t cols, int64_t ld,
                               int32_t batch, int64_t stride, std::size_t elem, bool write) {
  for (int32_t k = 0; k < batch; ++k)
    for (uint64_t j = 0; j < cols; ++j)
      races::note(static_cast<const char*>(p) + (std::size_t(k) * stride + j * ld) * elem,
                  rows * elem, write);
  return rows * cols * std::uint64_t(batch) * elem;
}

// What compute() reads and writes, for the race detector and the counters.
void note_accesses(const Product& p) {
  const MatmulDesc& desc = p.desc;
  const uint32_t e = desc.epilogue;
  const int32_t n = p.s.batch;
  unsigned long long read = 0, written = 0;
  for (const auto& [m, l] : {std::pair{p.A, &p.a}, std::pair{p.B, &p.b}})
    read += note_matrix(m, l->rows, l->cols, l->ld, n, l->stride, type_size(l->type), false);
  if (p.beta != 0.0f)
    read += note_matrix(p.C, p.s.m, p.s.n, p.c.ld, n, p.c.stride, type_size(p.c.type), false);
  if (has_bias(e))
    read += note_matrix(desc.bias, p.s.m, 1, int64_t(p.s.m), n, desc.bias_batch_stride,
                        type_size(p.bias_type), false);
  if (is_bgrad(e))
    written += note_matrix(desc.bias, p.s.m, 1, int64_t(p.s.m), 1, 0, type_size(p.bias_type), true);
  if (has_aux(e))
    (writes_aux(e) ? written : read) +=
        note_matrix(desc.aux, p.s.m, p.s.n, desc.aux_ld, n, desc.aux_batch_stride,
                    type_size(p.aux_type), writes_aux(e));
  written += note_matrix(p.D, p.s.m, p.s.n, p.d.ld, n, p.d.stride, type_size(p.d.type), true);
  // Batched products (the unfused attention's) have a site of their own.
  counters::product(n > 1 ? "cublasLtMatmul batched" : "cublasLtMatmul", read, written,
                    std::uint64_t(p.s.m) * p.s.n * p.s.k * std::uint64_t(n) / 2048);
}

void compute(const Product& p) {
  note_accesses(p);
  const MatmulDesc& desc = p.desc;
  const MatrixLayout &a = p.a, &b = p.b, &c = p.c, &d = p.d;
  const uint32_t e = desc.epilogue;
  const bool ta = desc.trans_a == CUBLAS_OP_T, tb = desc.trans_b == CUBLAS_OP_T;
  if (is_bgrad(e)) {  // one product (check): op(A)'s sums over k, before D may overwrite A
    std::vector<float> sums(p.s.m);
    for (uint64_t i = 0; i < p.s.m; ++i) {
      double acc = 0.0;
      for (uint64_t k = 0; k < p.s.k; ++k)
        acc += load(p.A, a.type, ta ? k + i * a.ld : i + k * a.ld);
      sums[i] = float(acc);
    }
    for (uint64_t i = 0; i < p.s.m; ++i) store(const_cast<void*>(desc.bias), p.bias_type, i, sums[i]);
  }
  for (int32_t batch = 0; batch < p.s.batch; ++batch) {
    const std::size_t oa = std::size_t(batch) * a.stride, ob = std::size_t(batch) * b.stride,
                      oc = std::size_t(batch) * c.stride, od = std::size_t(batch) * d.stride;
    for (uint64_t j = 0; j < p.s.n; ++j)
      for (uint64_t i = 0; i < p.s.m; ++i) {
        double acc = 0.0;
        for (uint64_t k = 0; k < p.s.k; ++k) {
          const float x = load(p.A, a.type, oa + (ta ? k + i * a.ld : i + k * a.ld));
          const float y = load(p.B, b.type, ob + (tb ? j + k * b.ld : k + j * b.ld));
          acc += double(x) * double(y);
        }
        double r = double(p.alpha) * acc;
        if (p.beta != 0.0f) r += double(p.beta) * load(p.C, c.type, oc + i + j * c.ld);
        if (has_bias(e))
          r += load(desc.bias, p.bias_type, std::size_t(batch) * desc.bias_batch_stride + i);
        const float pre = float(r);
        const std::size_t at_aux = std::size_t(batch) * desc.aux_batch_stride + i + j * desc.aux_ld;
        if (writes_aux(e)) store(desc.aux, p.aux_type, at_aux, pre);
        float out = pre;
        // GELU's tanh form: 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3).
        constexpr double kRoot2OverPi = 0.7978845608028654, kCubic = 0.044715;
        if (has_gelu(e)) {
          const double x = pre;
          out = float(0.5 * x * (1.0 + std::tanh(kRoot2OverPi * (x + kCubic * x * x * x))));
        }
        if (is_dgelu(e)) {  // times d gelu / dx at the forward's input
          const double x = load(desc.aux, p.aux_type, at_aux);
          const double t = std::tanh(kRoot2OverPi * (x + kCubic * x * x * x));
          const double slope = 0.5 * (1.0 + t) +
                               0.5 * x * (1.0 - t * t) * kRoot2OverPi * (1.0 + 3.0 * kCubic * x * x);
          out = float(double(pre) * slope);
        }
        store(p.D, d.type, od + i + j * d.ld, out);
      }
  }
}

}  // namespace

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
  if ((uses_bias(e) && desc->bias == nullptr) || (has_aux(e) && desc->aux == nullptr) ||
      A == nullptr || B == nullptr || D == nullptr || (beta != 0.0f && C == nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (C == D && (c->ld != d->ld || c->type != d->type || c->stride != d->stride))
    return CUBLAS_STATUS_INVALID_VALUE;  // in place needs one layout
  const int32_t bias_type = desc->bias_type == -1 ? int32_t(d->type) : desc->bias_type;
  const int32_t aux_type = desc->aux_type == -1 ? int32_t(d->type) : desc->aux_type;
  // Every array must lie inside its device allocation (or be host memory).
  const auto inside = [](const void* p, std::size_t bytes) { return device_range_ok(p, bytes); };
  if (!inside(A, extent(a->rows, a->cols, a->ld, s.batch, a->stride, type_size(a->type))) ||
      !inside(B, extent(b->rows, b->cols, b->ld, s.batch, b->stride, type_size(b->type))) ||
      (beta != 0.0f &&
       !inside(C, extent(c->rows, c->cols, c->ld, s.batch, c->stride, type_size(c->type)))) ||
      !inside(D, extent(d->rows, d->cols, d->ld, s.batch, d->stride, type_size(d->type))) ||
      (has_bias(e) && !inside(desc->bias, extent(s.m, 1, int64_t(s.m), s.batch,
                                                 desc->bias_batch_stride, type_size(bias_type)))) ||
      (is_bgrad(e) && !inside(desc->bias, s.m * type_size(bias_type))) ||
      (has_aux(e) && !inside(desc->aux, extent(s.m, s.n, desc->aux_ld, s.batch,
                                               desc->aux_batch_stride, type_size(aux_type)))))
    return CUBLAS_STATUS_EXECUTION_FAILED;

  enqueue(stream,
          "cublasLtMatmul " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
              std::to_string(s.k) + (s.batch > 1 ? " x" + std::to_string(s.batch) : ""),
          [p = Product{*desc, *a, *b, *c, *d, s, alpha, beta, A, B, C, D, bias_type, aux_type}] {
            compute(p);
            return true;
          });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace pptrain_emu::lt
