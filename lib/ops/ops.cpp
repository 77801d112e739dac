// Default implementations shared by the backends.
#include "ops/ops.hpp"

#include <cstdio>
#include <new>
#include <stdexcept>

namespace pptrain::ops {

namespace {
[[noreturn]] void no_graphs(const Ops& ops) {
  throw std::logic_error(ops.name() + " cannot capture its work as a graph");
}

std::string mib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / (1024.0 * 1024.0));
  return text;
}
}  // namespace

OutOfMemory::OutOfMemory(std::size_t bytes_asked, std::size_t held_then, const std::string& on,
                         const std::string& purpose)
    : std::runtime_error("out of memory on " + on + ": " +
                         (purpose.empty() ? std::string("an allocation") : purpose) + " of " +
                         mib(bytes_asked) + " could not be had, with " + mib(held_then) +
                         " held"),
      bytes(bytes_asked),
      held(held_then),
      backend(on) {}

void* Ops::allocate_host(std::size_t bytes) {
  return ::operator new(bytes, std::align_val_t{256});
}
void Ops::free_host(void* p) noexcept { ::operator delete(p, std::align_val_t{256}); }

void Ops::layernorm_backward(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                             const Act* w, const float* mean, const float* rstd, float* dw,
                             float* db, int N, int C) {
  layernorm_backward_input(dinp, dresidual, dout, inp, w, mean, rstd, N, C);
  layernorm_backward_weight(dw, db, dout, inp, mean, rstd, N, C);
}

void Ops::rmsnorm_backward(Act* dinp, const Act* dresidual, const Act* dout, const Act* inp,
                           const Act* w, const float* rstd, float* dw, int N, int C) {
  rmsnorm_backward_input(dinp, dresidual, dout, inp, w, rstd, N, C);
  rmsnorm_backward_weight(dw, dout, inp, rstd, N, C);
}

void Ops::linear_forward(Act* out, Act* gelu_out, const Act* inp, const Act* w, const Act* bias,
                         int N, int Cin, int Cout) {
  gemm(false, false, N, Cout, Cin, 1.0f, inp, w, 0.0f, out);
  if (bias) add_bias(out, bias, N, Cout);
  if (gelu_out) gelu_forward(gelu_out, out, std::size_t(N) * std::size_t(Cout));
}

void Ops::gemm_residual(bool trans_b, int M, int N, int K, const Act* A, const Act* B,
                        const Act* bias, const Act* R, Act* D) {
  gemm(false, trans_b, M, N, K, 1.0f, A, B, 0.0f, D);
  if (bias) add_bias(D, bias, M, N);
  add(D, D, R, std::size_t(M) * std::size_t(N));
}

void Ops::linear_backward_input(Act* dinp, const Act* dout, const Act* w, const Act* gelu_inp,
                                int N, int Cin, int Cout) {
  gemm(false, true, N, Cin, Cout, 1.0f, dout, w, 0.0f, dinp);
  if (gelu_inp) gelu_backward(dinp, gelu_inp, dinp, std::size_t(N) * std::size_t(Cin));
}

void Ops::begin_capture() { no_graphs(*this); }
void Ops::end_capture() { no_graphs(*this); }
void Ops::replay() { no_graphs(*this); }

void Ops::linear_grads(float* dw, float* dbias, const Act* inp, const Act* dout, int N, int Cin,
                       int Cout) {
  linear_weight_grad(dw, inp, dout, N, Cin, Cout);
  if (dbias) bias_backward(dbias, dout, N, Cout);
}

void Ops::ring_attention_forward_step(Act*, void*, SeqPiece, SeqPiece, int, int, int, int, bool) {
  throw std::logic_error(name() + " has no ring attention (context parallelism)");
}

void Ops::ring_attention_backward_step(Act*, Act*, const Act*, const Act*, const void*, SeqPiece,
                                       SeqPiece, int, int, int, int) {
  throw std::logic_error(name() + " has no ring attention (context parallelism)");
}

}  // namespace pptrain::ops
