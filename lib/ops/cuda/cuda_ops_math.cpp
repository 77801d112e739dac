// CUDA backend: matrix products (cuBLASLt, gemm.hpp) and the ops that map one-to-one
// onto a kernel launcher of kernels.hpp, typed by the compute dtype.
#include "core/error.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace pptrain::ops {

// ---- Matrix products ----

void CudaOps::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const Act* A,
                   const Act* B, float beta, Act* C) {
  PPTRAIN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta * C: only the two cases a caller can mean
    PPTRAIN_CHECK(beta == 0.0f || beta == 1.0f, "gemm: K == 0 needs beta 0 or 1");
    if (beta == 0.0f) fill_zero(C, std::size_t(M) * N * dtype_size(dtype_));
    return;
  }
  cuda::GemmProblem p;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.M = M, p.N = N, p.K = K;
  p.ab = p.cd = dtype_;
  p.accumulate = beta != 0.0f;
  gemm_.run(p, alpha, {A, B, C}, beta, stream());
}

void CudaOps::linear_forward(Act* out, Act* gelu_out, const Act* inp, const Act* w, const Act* bias,
                             int N, int Cin, int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin > 0 && Cout > 0, "linear_forward: bad sizes");
  if (N == 0) return;
  if (fuse_epilogues_ && bias != nullptr) {
    cuda::GemmProblem p;
    p.M = N, p.N = Cout, p.K = Cin;
    p.ab = p.cd = dtype_;
    cuda::GemmOperands x{inp, w, out, bias, nullptr};
    // cuBLASLt's GELU epilogue is the tanh form but may use a fast tanh: fused only
    // for bf16 activations, whose rounding dwarfs that; fp32 keeps the GELU kernel.
    const bool fuse_gelu = gelu_out != nullptr && dtype_ == DType::BF16;
    if (fuse_gelu) {
      // D = gelu(inp @ w + bias) goes to gelu_out; the pre-activation (aux) to out.
      p.epilogue = cuda::Epilogue::kGeluAuxBias;
      x.c = gelu_out;
      x.aux = out;
    } else {
      p.epilogue = cuda::Epilogue::kBias;
    }
    if (gemm_.try_run(p, 1.0f, x, 0.0f, stream())) {
      if (gelu_out != nullptr && !fuse_gelu)
        gelu_forward(gelu_out, out, std::size_t(N) * std::size_t(Cout));
      return;
    }
  }
  // Unfused: product, bias, GELU (also when cuBLASLt offers no fused algorithm).
  Ops::linear_forward(out, gelu_out, inp, w, bias, N, Cin, Cout);
}

void CudaOps::gemm_residual(bool trans_b, int M, int N, int K, const Act* A, const Act* B,
                            const Act* bias, const Act* R, Act* D) {
  PPTRAIN_CHECK(M >= 0 && N >= 0 && K > 0, "gemm_residual: bad sizes");
  if (M == 0 || N == 0) return;
  // One product: D = A op(B) + R (beta 1, C = R) + bias (the bias epilogue).
  if (fuse_epilogues_) {
    cuda::GemmProblem p;
    p.trans_b = trans_b;
    p.M = M, p.N = N, p.K = K;
    p.ab = p.cd = dtype_;
    p.accumulate = true;
    p.epilogue = bias ? cuda::Epilogue::kBias : cuda::Epilogue::kNone;
    cuda::GemmOperands x{A, B, const_cast<Act*>(R), bias};
    x.d = D;
    if (gemm_.try_run(p, 1.0f, x, 1.0f, stream())) return;
  }
  Ops::gemm_residual(trans_b, M, N, K, A, B, bias, R, D);
}

void CudaOps::linear_backward_input(Act* dinp, const Act* dout, const Act* w,
                                    const Act* gelu_inp, int N, int Cin, int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin > 0 && Cout > 0, "linear_backward_input: bad sizes");
  if (N == 0) return;
  // In bf16 (as the forward's GELU epilogue) one product: dinp = (dout @ w^T) times
  // gelu' at the GELU's input, cuBLASLt's DGELU epilogue reading it as aux.
  if (fuse_epilogues_ && gelu_inp != nullptr && dtype_ == DType::BF16) {
    cuda::GemmProblem p;
    p.trans_b = true;
    p.M = N, p.N = Cin, p.K = Cout;
    p.ab = p.cd = dtype_;
    p.epilogue = cuda::Epilogue::kDGelu;
    if (gemm_.try_run(p, 1.0f, {dout, w, dinp, nullptr, gelu_inp}, 0.0f, stream())) return;
  }
  Ops::linear_backward_input(dinp, dout, w, gelu_inp, N, Cin, Cout);
}

namespace {
// dw[Cin,Cout] += inp^T @ dout: compute-dtype inputs, fp32 C and D, beta 1.
cuda::GemmProblem weight_grad_problem(DType compute, int N, int Cin, int Cout) {
  cuda::GemmProblem p;
  p.trans_a = true;
  p.M = Cin, p.N = Cout, p.K = N;
  p.ab = compute;
  p.cd = DType::F32;
  p.accumulate = true;
  return p;
}
}  // namespace

void CudaOps::linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                                 int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin > 0 && Cout > 0, "linear_weight_grad: bad sizes");
  if (N == 0) return;
  gemm_.run(weight_grad_problem(dtype_, N, Cin, Cout), 1.0f, {inp, dout, dw}, 1.0f, stream());
}

void CudaOps::linear_grads(float* dw, float* dbias, const Act* inp, const Act* dout, int N,
                           int Cin, int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin > 0 && Cout > 0, "linear_grads: bad sizes");
  if (N == 0) return;
  // The product's BGRAD epilogue sums dout's columns as it reads them; it writes the sums
  // (cuBLASLt does not accumulate them), so they go to scratch and are added to dbias.
  if (fuse_epilogues_ && dbias != nullptr) {
    cuda::GemmProblem p = weight_grad_problem(dtype_, N, Cin, Cout);
    p.epilogue = cuda::Epilogue::kBGrad;
    auto* sums = static_cast<float*>(workspace(std::size_t(Cout) * sizeof(float)));
    if (gemm_.try_run(p, 1.0f, {inp, dout, dw, sums}, 1.0f, stream())) {
      cuda::add_column_sums(dbias, sums, 1, Cout, stream());
      return;
    }
  }
  Ops::linear_grads(dw, dbias, inp, dout, N, Cin, Cout);
}

void CudaOps::add_bias(Act* out, const Act* bias, int N, int C) {
  launch_typed([](auto... args) { cuda::add_bias(args...); }, out, bias, N, C);
}

void CudaOps::bias_backward(float* dbias, const Act* dout, int N, int C) {
  auto* scratch =
      static_cast<float*>(workspace(cuda::bias_backward_scratch_floats(N, C) * sizeof(float)));
  launch_typed([](auto... args) { cuda::bias_backward(args...); }, dbias, dout, N, C, scratch);
}

// ---- Normalisation and activation ----

void CudaOps::layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w,
                                const Act* b, int N, int C) {
  launch_typed([](auto... args) { cuda::layernorm_forward(args...); }, out, mean, rstd, inp, w, b,
               N, C);
}

void CudaOps::layernorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout,
                                       const Act* inp, const Act* w, const float* mean,
                                       const float* rstd, int N, int C) {
  launch_typed([](auto... args) { cuda::layernorm_backward_input(args...); }, dinp, dresidual,
               dout, inp, w, mean, rstd, N, C);
}

void CudaOps::layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                        const float* mean, const float* rstd, int N, int C) {
  auto* scratch = static_cast<float*>(
      workspace(cuda::layernorm_backward_weight_scratch_floats(N, C) * sizeof(float)));
  launch_typed([](auto... args) { cuda::layernorm_backward_weight(args...); }, dw, db, dout, inp,
               mean, rstd, N, C, scratch);
}

// One pass where the norm's shared memory fits the device (C up to about 3,500 on an
// H100); the two kernels otherwise.
void CudaOps::layernorm_backward(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                                 const Act* w, const float* mean, const float* rstd, float* dw,
                                 float* db, int N, int C) {
  if (cuda::layernorm_backward_shared_bytes(C) > std::size_t(max_smem_optin_)) {
    Ops::layernorm_backward(dinp, dresidual, dout, inp, w, mean, rstd, dw, db, N, C);
    return;
  }
  auto* scratch = static_cast<float*>(
      workspace(cuda::layernorm_backward_weight_scratch_floats(N, C) * sizeof(float)));
  launch_typed([](auto... args) { cuda::layernorm_backward(args...); }, dinp, dresidual, dout,
               inp, w, mean, rstd, dw, db, N, C, scratch, max_smem_optin_);
}

void CudaOps::rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* w, int N, int C,
                              float eps) {
  launch_typed([](auto... args) { cuda::rmsnorm_forward(args...); }, out, rstd, inp, w, N, C, eps);
}

void CudaOps::rmsnorm_backward_input(Act* dinp, const Act* dresidual, const Act* dout,
                                     const Act* inp, const Act* w, const float* rstd, int N,
                                     int C) {
  launch_typed([](auto... args) { cuda::rmsnorm_backward_input(args...); }, dinp, dresidual, dout,
               inp, w, rstd, N, C);
}

void CudaOps::rmsnorm_backward_weight(float* dw, const Act* dout, const Act* inp,
                                      const float* rstd, int N, int C) {
  auto* scratch = static_cast<float*>(
      workspace(cuda::rmsnorm_backward_weight_scratch_floats(N, C) * sizeof(float)));
  launch_typed([](auto... args) { cuda::rmsnorm_backward_weight(args...); }, dw, dout, inp, rstd,
               N, C, scratch);
}

// One pass where the norm's shared memory fits the device (C up to about 7,000 on an
// H100); the two kernels otherwise.
void CudaOps::rmsnorm_backward(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                               const Act* w, const float* rstd, float* dw, int N, int C) {
  if (cuda::rmsnorm_backward_shared_bytes(C) > std::size_t(max_smem_optin_)) {
    Ops::rmsnorm_backward(dinp, dresidual, dout, inp, w, rstd, dw, N, C);
    return;
  }
  auto* scratch = static_cast<float*>(
      workspace(cuda::rmsnorm_backward_weight_scratch_floats(N, C) * sizeof(float)));
  launch_typed([](auto... args) { cuda::rmsnorm_backward(args...); }, dinp, dresidual, dout, inp,
               w, rstd, dw, N, C, scratch, max_smem_optin_);
}

void CudaOps::swiglu_forward(Act* out, const Act* gate_up, int N, int F) {
  launch_typed([](auto... args) { cuda::swiglu_forward(args...); }, out, gate_up, N, F);
}

void CudaOps::swiglu_backward(Act* dgate_up, const Act* dout, const Act* gate_up, int N, int F) {
  launch_typed([](auto... args) { cuda::swiglu_backward(args...); }, dgate_up, dout, gate_up, N, F);
}

void CudaOps::rope(Act* x, int N, int T, int stride, int heads, int head_size, float theta,
                   bool inverse, int first) {
  launch_typed([](auto... args) { cuda::rope(args...); }, x, N, T, stride, heads, head_size, theta,
               inverse, first);
}

void CudaOps::gelu_forward(Act* out, const Act* inp, std::size_t n) {
  launch_typed([](auto... args) { cuda::gelu_forward(args...); }, out, inp, n);
}

void CudaOps::gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) {
  launch_typed([](auto... args) { cuda::gelu_backward(args...); }, dinp, inp, dout, n);
}

// ---- Embedding and loss ----

void CudaOps::embedding_forward(Act* out, const int32_t* tokens, const Act* wte, int vocab_begin,
                                int vocab_rows, const Act* wpe, int B, int T, int C) {
  launch_typed([](auto... args) { cuda::embedding_forward(args...); }, out, tokens, wte,
               vocab_begin, vocab_rows, wpe, B, T, C);
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                                 int vocab_begin, int vocab_rows, int B, int T, int C) {
  void* scratch = workspace(cuda_embedding_scratch_bytes(vocab_rows, B * T));
  launch_typed([](auto... args) { cuda::embedding_backward(args...); }, dwte, dwpe, dout, tokens,
               vocab_begin, vocab_rows, B, T, C, scratch);
}

void CudaOps::cross_entropy(float* losses, Act* dlogits, const Act* logits, const int32_t* targets,
                            int N, int V, int Vp, float dloss) {
  launch_typed([](auto... args) { cuda::cross_entropy(args...); }, losses, dlogits, logits, targets,
               N, V, Vp, dloss);
}

void CudaOps::ce_row_max(float* rowmax, float* stats, const Act* logits, int N, int Vl,
                         int col_begin, int V) {
  launch_typed([](auto... args) { cuda::ce_row_max(args...); }, rowmax, stats, logits, N, Vl,
               col_begin, V);
}

void CudaOps::ce_partial_sums(float* stats, const Act* logits, const float* rowmax,
                              const int32_t* targets, int N, int Vl, int col_begin, int V) {
  launch_typed([](auto... args) { cuda::ce_partial_sums(args...); }, stats, logits, rowmax, targets,
               N, Vl, col_begin, V);
}

void CudaOps::ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                        const float* stats, const int32_t* targets, int N, int Vl, int col_begin,
                        int V, float dloss) {
  launch_typed([](auto... args) { cuda::ce_finish(args...); }, losses, dlogits, logits, rowmax,
               stats, targets, N, Vl, col_begin, V, dloss);
}

// ---- Elementwise ----

void CudaOps::add(Act* out, const Act* a, const Act* b, std::size_t n) {
  launch_typed([](auto... args) { cuda::add(args...); }, out, a, b, n);
}

void CudaOps::copy_columns(Act* dst, int dst_width, int dst_col, const Act* src, int src_width,
                           int src_col, int rows, int cols) {
  launch_typed([](auto... args) { cuda::copy_columns(args...); }, dst, dst_width, dst_col, src,
               src_width, src_col, rows, cols);
}

}  // namespace pptrain::ops
