// CUDA backend: matrix products (cuBLASLt, gemm.hpp) and the ops that map one-to-one
// onto a kernel launcher of kernels.hpp, typed by the compute dtype.
#include "core/error.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace pptrain::ops {

using cuda::typed;

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

void CudaOps::linear_weight_grad(float* dw, const Act* inp, const Act* dout, int N, int Cin,
                                 int Cout) {
  PPTRAIN_CHECK(N >= 0 && Cin > 0 && Cout > 0, "linear_weight_grad: bad sizes");
  if (N == 0) return;
  // dw[Cin,Cout] += inp^T @ dout: compute-dtype inputs, fp32 C and D, beta 1.
  cuda::GemmProblem p;
  p.trans_a = true;
  p.M = Cin, p.N = Cout, p.K = N;
  p.ab = dtype_;
  p.cd = DType::F32;
  p.accumulate = true;
  gemm_.run(p, 1.0f, {inp, dout, dw}, 1.0f, stream());
}

void CudaOps::add_bias(Act* out, const Act* bias, int N, int C) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::add_bias<T>(typed<T>(out), typed<T>(bias), N, C, stream());
  });
}

void CudaOps::bias_backward(float* dbias, const Act* dout, int N, int C) {
  auto* scratch =
      static_cast<float*>(workspace(cuda::bias_backward_scratch_floats(N, C) * sizeof(float)));
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::bias_backward<T>(dbias, typed<T>(dout), N, C, scratch, stream());
  });
}

// ---- Normalisation and activation ----

void CudaOps::layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w,
                                const Act* b, int N, int C) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::layernorm_forward<T>(typed<T>(out), mean, rstd, typed<T>(inp), typed<T>(w), typed<T>(b),
                               N, C, stream());
  });
}

void CudaOps::layernorm_backward_input(Act* dinp, const Act* dout, const Act* inp, const Act* w,
                                       const float* mean, const float* rstd, int N, int C) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::layernorm_backward_input<T>(typed<T>(dinp), typed<T>(dout), typed<T>(inp), typed<T>(w),
                                      mean, rstd, N, C, stream());
  });
}

void CudaOps::layernorm_backward_weight(float* dw, float* db, const Act* dout, const Act* inp,
                                        const float* mean, const float* rstd, int N, int C) {
  auto* scratch = static_cast<float*>(
      workspace(cuda::layernorm_backward_weight_scratch_floats(N, C) * sizeof(float)));
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::layernorm_backward_weight<T>(dw, db, typed<T>(dout), typed<T>(inp), mean, rstd, N, C,
                                       scratch, stream());
  });
}

void CudaOps::gelu_forward(Act* out, const Act* inp, std::size_t n) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::gelu_forward<T>(typed<T>(out), typed<T>(inp), n, stream());
  });
}

void CudaOps::gelu_backward(Act* dinp, const Act* inp, const Act* dout, std::size_t n) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::gelu_backward<T>(typed<T>(dinp), typed<T>(inp), typed<T>(dout), n, stream());
  });
}

// ---- Embedding and loss ----

void CudaOps::embedding_forward(Act* out, const int32_t* tokens, const Act* wte, int vocab_begin,
                                int vocab_rows, const Act* wpe, int B, int T, int C) {
  with_type([&](auto t) {
    using E = typename decltype(t)::type;
    cuda::embedding_forward<E>(typed<E>(out), tokens, typed<E>(wte), vocab_begin, vocab_rows,
                               typed<E>(wpe), B, T, C, stream());
  });
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                                 int vocab_begin, int vocab_rows, int B, int T, int C) {
  with_type([&](auto t) {
    using E = typename decltype(t)::type;
    cuda::embedding_backward<E>(dwte, dwpe, typed<E>(dout), tokens, vocab_begin, vocab_rows, B, T,
                                C, stream());
  });
}

void CudaOps::cross_entropy(float* losses, Act* dlogits, const Act* logits, const int32_t* targets,
                            int N, int V, int Vp, float dloss) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::cross_entropy<T>(losses, typed<T>(dlogits), typed<T>(logits), targets, N, V, Vp, dloss,
                           stream());
  });
}

void CudaOps::ce_row_max(float* rowmax, const Act* logits, int N, int Vl, int col_begin, int V) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::ce_row_max<T>(rowmax, typed<T>(logits), N, Vl, col_begin, V, stream());
  });
}

void CudaOps::ce_partial_sums(float* stats, const Act* logits, const float* rowmax,
                              const int32_t* targets, int N, int Vl, int col_begin, int V) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::ce_partial_sums<T>(stats, typed<T>(logits), rowmax, targets, N, Vl, col_begin, V,
                             stream());
  });
}

void CudaOps::ce_finish(float* losses, Act* dlogits, const Act* logits, const float* rowmax,
                        const float* stats, const int32_t* targets, int N, int Vl, int col_begin,
                        int V, float dloss) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::ce_finish<T>(losses, typed<T>(dlogits), typed<T>(logits), rowmax, stats, targets, N, Vl,
                       col_begin, V, dloss, stream());
  });
}

// ---- Elementwise ----

void CudaOps::add(Act* out, const Act* a, const Act* b, std::size_t n) {
  with_type([&](auto t) {
    using T = typename decltype(t)::type;
    cuda::add<T>(typed<T>(out), typed<T>(a), typed<T>(b), n, stream());
  });
}


}  // namespace pptrain::ops
