// cuBLASLt plans for row-major products (see gemm.hpp).
//
// Our arrays are row-major and cuBLASLt is column-major. A row-major [R,C] array is the
// same memory as a column-major [C,R] array, i.e. its transpose. So for row-major
// C = op(A) op(B) we ask cuBLASLt for the column-major product C^T = op(B)^T op(A)^T:
// cuBLASLt's first operand is our B, its second our A, its m is our N and its n our M.
// A bias over our columns is then a bias over cuBLASLt's rows, which is what its bias
// epilogue broadcasts; and the sum over K of our B is the sum over K of cuBLASLt's A,
// whose length is D's rows: the BGRADA epilogue.
#include "ops/cuda/gemm.hpp"

#include <spdlog/spdlog.h>

#include <sstream>
#include <stdexcept>

#include "core/error.hpp"
#include "ops/cuda/cuda_check.hpp"

namespace pptrain::ops::cuda {

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }

// Largest power of two (at most 256) dividing the address; 256 for null.
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

template <typename V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& value) {
  PPTRAIN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}

// A column-major rows x cols layout with leading dimension ld, repeated `batch` times.
cublasLtMatrixLayout_t make_layout(DType t, int rows, int cols, int ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  PPTRAIN_CUDA_CHECK(
      cublasLtMatrixLayoutCreate(&l, cuda_type(t), uint64_t(rows), uint64_t(cols), int64_t(ld)));
  if (batch > 1) {
    const int32_t count = batch;
    PPTRAIN_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof(count)));
    PPTRAIN_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::kNone:
      return "none";
    case Epilogue::kBias:
      return "bias";
    case Epilogue::kGeluAuxBias:
      return "bias+gelu";
    case Epilogue::kDGelu:
      return "dgelu";
    case Epilogue::kBGrad:
      return "bgrad";
  }
  return "?";
}

cublasLtEpilogue_t cublaslt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kBGrad:
      return CUBLASLT_EPILOGUE_BGRADA;
    case Epilogue::kNone:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
// The epilogues that read or (kBGrad) write the bias pointer.
bool has_bias(Epilogue e) {
  return e == Epilogue::kBias || e == Epilogue::kGeluAuxBias || e == Epilogue::kBGrad;
}
bool has_aux(Epilogue e) { return e == Epilogue::kGeluAuxBias || e == Epilogue::kDGelu; }

}  // namespace

std::string GemmProblem::describe() const {
  std::ostringstream s;
  s << "gemm M=" << M << " N=" << N << " K=" << K << " trans_a=" << trans_a
    << " trans_b=" << trans_b << " batch=" << batch;
  if (batch > 1) s << " strides=" << stride_a << "/" << stride_b << "/" << stride_c;
  s << " A/B " << dtype_name(ab) << " C/D " << dtype_name(cd) << " epilogue "
    << epilogue_name(epilogue) << (accumulate ? " accumulate" : "");
  return s.str();
}

// The cuBLASLt objects of one problem. In cuBLASLt's naming: a is our B, b is our A.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l) (void)cublasLtMatrixLayoutDestroy(l);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};

Gemm::Key Gemm::key_of(const GemmProblem& p, const GemmOperands& x) {
  return Key{
      p,         alignment(x.a),   alignment(x.b), alignment(x.c), alignment(x.bias),
      alignment(x.aux), alignment(x.d ? x.d : x.c)};
}

Gemm::Gemm(std::size_t workspace_bytes) : workspace_(workspace_bytes) {}
Gemm::~Gemm() = default;

std::unique_ptr<Gemm::Plan> Gemm::make_plan(const Key& key, const GemmOperands& x) const {
  const GemmProblem& p = key.p;
  auto plan = std::make_unique<Plan>();
  // Column-major views (see the comment at the top): our B as op(B)^T [N,K], our A as
  // op(A)^T [K,M], C^T and D^T [N,M] with leading dimension N.
  if (p.trans_b)
    plan->a = make_layout(p.ab, p.K, p.N, p.K, p.batch, p.stride_b);
  else
    plan->a = make_layout(p.ab, p.N, p.K, p.N, p.batch, p.stride_b);
  if (p.trans_a)
    plan->b = make_layout(p.ab, p.M, p.K, p.M, p.batch, p.stride_a);
  else
    plan->b = make_layout(p.ab, p.K, p.M, p.K, p.batch, p.stride_a);
  plan->c = make_layout(p.cd, p.N, p.M, p.N, p.batch, p.stride_c);
  plan->d = make_layout(p.cd, p.N, p.M, p.N, p.batch, p.stride_c);

  PPTRAIN_CUDA_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (p.epilogue != Epilogue::kNone) {
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(cublaslt_epilogue(p.epilogue)));
    // Bias and aux elements default to D's type, which is what we pass. The heuristic
    // reads the pointers' alignment from the descriptor.
    if (has_bias(p.epilogue)) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, x.bias);
    if (has_aux(p.epilogue)) {
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.aux);
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(p.N));
    }
  }

  // cuBLASLt wants the aux leading dimension to be a multiple of 8: no algorithm.
  if (has_aux(p.epilogue) && p.N % 8 != 0) {
    plan->heuristic_status = CUBLAS_STATUS_NOT_SUPPORTED;
    return plan;
  }

  cublasLtMatmulPreference_t pref = nullptr;
  PPTRAIN_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::unique_ptr<void, void (*)(void*)> pref_owner(pref, [](void* q) {
    (void)cublasLtMatmulPreferenceDestroy(static_cast<cublasLtMatmulPreference_t>(q));
  });
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    PPTRAIN_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_.bytes()));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // cuBLASLt's A: our B
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  // "No algorithm" comes back as CUBLAS_STATUS_NOT_SUPPORTED or zero results.
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_.get(), plan->desc, plan->a, plan->b, plan->c, plan->d, pref, 1, &result, &returned);
  plan->heuristic_status = status;
  plan->found =
      status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (plan->found) plan->algo = result.algo;
  return plan;
}

bool Gemm::try_run(const GemmProblem& p, float alpha, const GemmOperands& x, float beta,
                   cudaStream_t stream) {
  PPTRAIN_CHECK(p.M > 0 && p.N > 0 && p.K > 0 && p.batch > 0,
                "gemm: sizes must be positive: " + p.describe());
  PPTRAIN_CHECK(p.accumulate == (beta != 0.0f), "gemm: accumulate must match beta != 0");
  PPTRAIN_CHECK(x.a && x.b && x.c, "gemm: null operand");
  if (p.epilogue != Epilogue::kNone) {
    PPTRAIN_CHECK(p.batch == 1, "gemm: epilogues need batch 1");
    PPTRAIN_CHECK(!has_bias(p.epilogue) || x.bias, "gemm: a bias epilogue needs a bias");
    PPTRAIN_CHECK(p.epilogue != Epilogue::kBGrad || p.cd == DType::F32,
                  "gemm: bias gradients are fp32 (D's type)");
    PPTRAIN_CHECK(!has_aux(p.epilogue) || (x.aux && !p.accumulate),
                  "gemm: GELU epilogues need aux and beta 0");
  }
  const Key key = key_of(p, x);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    it = plans_.emplace(key, make_plan(key, x)).first;
    if (!it->second->found && p.epilogue != Epilogue::kNone)
      spdlog::warn("cuBLASLt has no algorithm for {} (heuristic: {}); it runs unfused, as a "
                   "product and then its epilogue's kernels",
                   p.describe(), cublasLtGetStatusString(it->second->heuristic_status));
  }
  Plan& plan = *it->second;
  if (!plan.found) return false;
  if (has_bias(p.epilogue)) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, x.bias);
  if (has_aux(p.epilogue)) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.aux);
  PPTRAIN_CUDA_CHECK(cublasLtMatmul(handle_.get(), plan.desc, &alpha, x.b, plan.a, x.a, plan.b,
                                    &beta, x.c, plan.c, x.d ? x.d : x.c, plan.d, &plan.algo,
                                    workspace_.get(), workspace_.bytes(), stream));
  return true;
}

void Gemm::run(const GemmProblem& p, float alpha, const GemmOperands& x, float beta,
               cudaStream_t stream) {
  if (try_run(p, alpha, x, beta, stream)) return;
  const Key key = key_of(p, x);
  const auto it = plans_.find(key);
  std::ostringstream s;
  s << "cuBLASLt has no algorithm for " << p.describe() << " (pointer alignments A " << key.align_a
    << ", B " << key.align_b << ", C " << key.align_c << " bytes; heuristic: "
    << (it != plans_.end() ? cublasLtGetStatusString(it->second->heuristic_status) : "not asked")
    << ")";
  throw std::runtime_error(s.str());
}

}  // namespace pptrain::ops::cuda
