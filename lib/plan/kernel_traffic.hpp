// What the CUDA backend's kernels and cuBLASLt products move through device memory, per
// launch, and what attention's tensor cores compute: the loads and stores each kernel's
// code makes, as the CUDA emulator counts them (tests/ops/emulation/emulator_counters.hpp),
// and a product's operands once each. The planner's time model prices a GPU layer's
// kernels from these; the emulated test `KernelTraffic` checks them against the counters.
// Sizes are doubles (element counts); e is the activations' element size (2: bf16).
#pragma once

namespace pptrain {

inline constexpr double kMmaFlops = 4096;  // one m16n8k16 instruction: 2 * 16 * 8 * 16

struct Traffic {
  double launches = 0;
  double read = 0, written = 0;  // bytes
  double mma = 0;  // tensor-core m16n8k16 instructions (4,096 FLOPs each)
  double bytes() const { return read + written; }
  Traffic& operator+=(const Traffic& o);
};
Traffic operator+(Traffic a, const Traffic& b);
Traffic operator*(double k, Traffic a);

// Row-wise norms over R rows of C (one warp a row), with their weight gradients as chunked
// column sums (64-row chunks, then one launch adding the chunks to the gradients).
Traffic layernorm_forward(double R, double C, double e);
Traffic layernorm_backward_input(double R, double C, double e);
Traffic layernorm_backward_weight(double R, double C, double e);
Traffic layernorm_backward(double R, double C, double e);  // both in one pass
Traffic rmsnorm_forward(double R, double C, double e);
Traffic rmsnorm_backward_input(double R, double C, double e);
Traffic rmsnorm_backward_weight(double R, double C, double e);
// SwiGLU over N rows of F (gate|up is 2F wide); rope in place on N rows of `heads` heads.
Traffic swiglu_forward(double N, double F, double e);
Traffic swiglu_backward(double N, double F, double e);
Traffic rope(double N, double heads, double hs, double e);
// A bias gradient a product wrote apart (C floats) added to the gradient.
Traffic add_column_sums(double C);

// The fused (flash) attention over B sequences of T, H query heads and KV key/value heads
// of hs: 64-row tiles, the causal tile pairs only. Forward: one launch; backward: the row
// dots, the dQ kernel and the dK/dV kernel.
Traffic flash_attention_forward(double B, double H, double T, double hs, double e);
Traffic flash_attention_backward(double B, double H, double KV, double T, double hs, double e);

// One cuBLASLt product D[M,N] = A[M,K] B[K,N], its operands read and written once: a and d
// the elements' sizes of A, B and of C, D; with C read (beta != 0), a bias read, the GELU's
// aux read (DGELU) or written (GELU_AUX), or a bias gradient (N floats) written.
struct ProductEpilogue {
  bool reads_c = false, bias = false, aux_read = false, aux_written = false, bias_grad = false;
};
Traffic product(double M, double N, double K, double a, double d, ProductEpilogue epi = {});

// One transformer layer's passes on one rank, as the model runs them on the CUDA backend
// in bf16 with fused attention: the products, the attention kernels and the other kernels
// (norms, activations, bias-gradient adds), each for F, B (input gradients, without a
// recomputed forward) and W (weight gradients).
struct LayerShape {
  double B = 0, T = 0;           // sequences and positions of a micro-batch
  double C = 0, heads = 0, kv_heads = 0, hs = 0;  // whole-layer sizes
  double ffn = 0;                // the MLP's hidden width
  double t = 1;                  // tensor-parallel ranks
  bool sp = false;               // sequence parallelism: the norms hold N / t rows
  bool llama = false;            // RMSNorm, rope, SwiGLU, no biases; else GPT-2
  // W right after B (every schedule but the zero-bubble ones): GPT-2's norms compute their
  // weight gradients in B, with the input gradients.
  bool weight_follows_input = true;
  double e = 2;
};
struct PassTraffic {
  Traffic products, attention, kernels;
  Traffic all() const { return products + attention + kernels; }
};
struct LayerTraffic {
  PassTraffic forward, backward_input, backward_weight;
};
LayerTraffic layer_traffic(const LayerShape& s);

// The last stage's head on one rank (no tensor parallelism): the final LayerNorm, the
// logits product, the cross-entropy with its gradient (one kernel a row: the row read
// three times, each of its 512 threads reading the target and its logit) and the loss's
// mean; in B the product into the input gradient and the norm's; in W the head's weight
// gradient and the norm's (RMSNorm for llama). V real and Vp padded vocabulary columns.
LayerTraffic head_traffic(double B, double T, double C, double V, double Vp, bool llama, double e);

}  // namespace pptrain
