// What the CUDA backend's kernels and cuBLASLt products move through device memory, per
// launch, and what attention's tensor cores compute: the loads and stores each kernel's
// code makes, as the CUDA emulator counts them (tests/ops/emulation/emulator_counters.hpp),
// and a product's operands once each. The planner's time model prices a GPU layer's
// kernels from these; the emulated test `KernelTraffic` checks them against the counters.
// Sizes are doubles (element counts); e is the activations' element size (2: bf16).
#pragma once
#include <vector>

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
Traffic operator-(Traffic a, const Traffic& b);
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
Traffic rmsnorm_backward(double R, double C, double e);  // both in one pass
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

// The unfused attention over B sequences of T, H query heads and KV key/value heads of
// hs: the heads split out of q|k|v (each key/value head copied for each query head of its
// group), the scores as a product batched over the heads, the causal softmax in place (a
// warp a row, its live entries loaded in 16-byte packs three times), the product with v,
// the heads merged back. Its backward: the heads split again (or, `recomputed`, the
// forward's first three launches), dout's split, the four batched products around the
// softmax's backward, and the q|k|v gradient merged (key/value heads summed over the
// group). The products are batched cuBLASLt launches, counted as products.
Traffic unfused_attention_forward(double B, double H, double KV, double T, double hs, double e);
Traffic unfused_attention_backward(double B, double H, double KV, double T, double hs, double e,
                                   bool recomputed);

// Ring attention (context parallelism) on rank `rank` of cp, its T rows of a sequence in
// two pieces of T / 2 (positions rank and 2 cp - 1 - rank of the sequence's 2 cp pieces),
// as RingAttention runs it with the fused kernels: at each of the cp steps its two query
// pieces against those of the two key/value pieces it holds then that come no later in
// the sequence (each a forward launch, merged into the output but the first's; each a
// backward's three launches, adding to the gradients). The other kernels: the own k|v
// block copied out in F and again in B, each arriving gradient added, the returned one
// copied into dqkv.
struct RingTraffic {
  std::vector<Traffic> forward_steps, backward_steps;
  Traffic forward_kernels, backward_kernels;
};
RingTraffic ring_attention(double B, double H, double KV, double T, double cp, int rank,
                           double hs, double e);

// One cuBLASLt product D[M,N] = A[M,K] B[K,N], its operands read and written once: a and d
// the elements' sizes of A, B and of C, D; with C read (beta != 0), a bias read, the GELU's
// aux read (DGELU) or written (GELU_AUX), or a bias gradient (N floats) written.
struct ProductEpilogue {
  bool reads_c = false, bias = false, aux_read = false, aux_written = false, bias_grad = false;
};
Traffic product(double M, double N, double K, double a, double d, ProductEpilogue epi = {});

// How the CUDA backend runs the attention core (cuda_ops_attention.cpp): the flash
// kernels; unfused, the probabilities kept as the layer's state; or unfused with the
// probabilities recomputed by the backward (flash on, a head size it does not take).
// Under context parallelism only the flash ring is modelled (the others run loops).
enum class AttentionKernels { Flash, Unfused, UnfusedRecomputed };

// One transformer layer's passes on one rank, as the model runs them on the CUDA backend
// in bf16: the products, the attention core's launches (its batched products included)
// and the other kernels (norms, activations, bias-gradient adds), each for F, B (input
// gradients, without a recomputed forward) and W (weight gradients).
struct LayerShape {
  double B = 0, T = 0;           // sequences and positions of a micro-batch
  double C = 0, heads = 0, kv_heads = 0, hs = 0;  // whole-layer sizes
  double ffn = 0;                // the MLP's hidden width
  double t = 1;                  // tensor-parallel ranks
  double cp = 1;                 // context-parallel ranks (T: this rank's positions)
  int rank = 0;                  // its rank in the cp group
  bool sp = false;               // sequence parallelism: the norms hold N / t rows
  // SP with parallel.overlap: the products that read gathered rows or write rows summed
  // over tp run a row block (N / t) at a time, each reading the whole weight.
  bool row_blocks = false;
  bool llama = false;            // RMSNorm, rope, SwiGLU, no biases; else GPT-2
  // W right after B (every schedule but the zero-bubble ones): the norms compute their
  // weight gradients in B, with the input gradients.
  bool weight_follows_input = true;
  AttentionKernels attention = AttentionKernels::Flash;
  double e = 2;
};
// The layer's products on one rank, each one launch (or row_blocks' t), their epilogues'
// bytes included: q|k|v (with the bias), proj and fcproj (with the bias and the residual,
// beta 1, where nothing is summed over tp; else alone, the adds following as kernels), fc
// (gate|up for llama; GPT-2's GELU writing its input as aux); in B their input gradients
// (fcproj's reading the aux: DGELU), in W their weight gradients (fp32, added to the
// gradient, with the bias gradient: BGRAD).
struct LayerProducts {
  Traffic qkv, proj, fc, fcproj;
  Traffic qkv_input, proj_input, fc_input, fcproj_input;
  Traffic qkv_weight, proj_weight, fc_weight, fcproj_weight;
};
LayerProducts layer_products(const LayerShape& s);

struct PassTraffic {
  Traffic products, attention, kernels;
  Traffic all() const { return products + attention + kernels; }
};
struct LayerTraffic {
  PassTraffic forward, backward_input, backward_weight;
};
LayerTraffic layer_traffic(const LayerShape& s);

// The last stage's head on tensor-parallel rank `rank` of t: the final norm (RMSNorm for
// llama) on the rows it holds (N / t under SP), the logits product into its Vp / t
// vocabulary columns and the cross-entropy with its gradient, then the loss's mean; in B
// the product into the input gradient (summed over tp by NCCL) and the norm's; in W the
// head's weight gradient and the norm's. Without tp the cross-entropy is one kernel a
// row (the row read twice); with it three (the shard's row statistics in one read, a
// thread a row scaling the sums to the max over the shards and reading the target's logit
// on the rank holding it, here its share of the real columns so that the ranks' traffic
// sums to the whole; the finish reading the row again). Every thread of the cross-entropy
// blocks (512) reads the row's statistics. V real and Vp padded vocabulary columns.
struct HeadShape {
  double B = 0, T = 0, C = 0;
  double V = 0, Vp = 0;
  double t = 1;
  bool sp = false, llama = false;
  double e = 2;
};
LayerTraffic head_traffic(const HeadShape& s, int rank = 0);

// What the embedding's backward reads depends on the tokens of a rank's vocabulary rows:
// the positions holding one, the distinct ones, the table gradient's shards (of
// embedding_shard_rows(C) rows) with one and their rows, and, summed over those shards,
// the positions of the 256-position tiles holding one of a shard's tokens.
struct TokenCounts {
  double positions = 0, distinct = 0, shards = 0, shard_rows = 0, tile_positions = 0;
};
double embedding_shard_rows(double C);
// Their expectation for N tokens drawn uniformly from V, of which a rank holds `rows`.
TokenCounts uniform_tokens(double N, double V, double rows, double C);

// The first stage's embedding on one rank of t, over `rows` vocabulary rows and the
// positions of B sequences of T (this rank's T / cp). F: the token rows looked up (each
// thread reads its row's token); with the position table (GPT-2) added in the same pass,
// or, vocab-parallel (tp or cp > 1), after the sum over tp on the held rows, one launch
// per piece of whole sequences. W: the table gradient (the tile bits: each token read,
// each of this rank's a bit set; each block reads its rows' bits, and where a shard has a
// token, its bits again and the tokens of the tiles they name; the rows that occur read
// and written once; the bits' memset, not a kernel, left out) and the position table's
// (over the batch in one pass, or per piece as column sums under cp).
struct EmbeddingShape {
  double B = 0, T = 0, C = 0, rows = 0;
  double t = 1, cp = 1;
  bool sp = false, positions = true;
  double e = 2;
};
LayerTraffic embedding_traffic(const EmbeddingShape& s, const TokenCounts& tokens);
// The table gradient's kernel alone (part of embedding_traffic's W).
Traffic embedding_table_grad(const EmbeddingShape& s, const TokenCounts& tokens);

}  // namespace pptrain
