// The one table of every per-micro-batch buffer the GPT model keeps: its size, which
// pass writes it, which passes read it, and where it lives between them once
// recomputation, sequence parallelism and the schedule's weight-gradient timing are
// applied. GptModel allocates from it, check-config predicts memory from it and prints
// it; nothing else lists the buffers.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace pptrain {

// What the model keeps and what it recomputes or shards.
struct ActivationPolicy {
  Recompute recompute = Recompute::None;
  int recompute_layers = 0;        // the first N layers of each chunk; 0: all of them
  // Sequence parallelism: the LayerNorm and residual regions hold N / tp token rows.
  bool sequence_parallel = false;
  // W runs right after B for every micro-batch (gpipe, 1f1b, interleaved): layers that
  // are fully recomputed then run B and W together, layer by layer, from one workspace.
  bool weight_follows_input = true;
  // tp > 1 with parallel.overlap: where W follows B, each layer's W runs inside its B,
  // beside the tensor-parallel sums of its input gradients.
  bool overlap_tensor_parallel = false;

  Recompute mode_of(int local_layer) const {
    return recompute_layers == 0 || local_layer < recompute_layers ? recompute : Recompute::None;
  }
  // Whether a chunk of `layers` layers runs each layer's W inside its B (W follows B, and
  // it has fully recomputed layers or overlaps the tensor-parallel sums).
  bool fused_backward(int layers) const {
    return weight_follows_input && layers > 0 &&
           (mode_of(0) == Recompute::Full || overlap_tensor_parallel);
  }
};

// Where a buffer lives between the passes of one micro-batch's chunk.
enum class Lifetime {
  Set,        // written by the forward (or received), kept until the set is released
  UntilB,     // written by the forward, read by B alone: given back when B ends
  FromB,      // written by B or by B's recomputation, read by W: from B until released
  Workspace,  // one copy per model, shared by all micro-batches: scratch, or recomputed
  // A stage-boundary array (output, output_grad, input_grad), each its own buffer lent by
  // the model from first use: a sent output until its send is done (a last chunk's until
  // the set is released), a gradient until the set is released. A hop between chunks on
  // one rank writes straight into the other set's array instead (see PipelineExecutor).
  Boundary,
};
constexpr int kLifetimes = 5;
const char* lifetime_name(Lifetime life);

// The buffers, per layer of a chunk, then per chunk, then the last chunk's head.
enum class Slot {
  // per layer
  x, ln1, ln1_mean, ln1_rstd, ln1_gathered, qkv, att_state, atty, partial, res2, ln2, ln2_mean,
  ln2_rstd, ln2_gathered, fch, fch_gelu, dout_gathered, dres2, dres2_gathered, dfch_act, dfch,
  dln2, dqkv, dln1, dx, recomputed_out,
  // per chunk
  tokens, targets, output, output_grad, input_grad, sp_scratch,
  // last chunk
  lnf, lnf_mean, lnf_rstd, logits, losses, dlnf, ce_max, ce_stats,
  count
};
constexpr int kSlots = int(Slot::count);
constexpr int kLayerSlots = int(Slot::tokens);
inline bool is_layer_slot(Slot s) { return int(s) < kLayerSlots; }

// Sizes the table is evaluated at: one micro-batch of one rank's tensor-parallel shard.
// The defaults of kv_heads, ffn, gated and norm_mean are GPT-2's block.
struct ActivationShape {
  int batch = 1, seq_len = 1, d_model = 1, heads = 1;  // heads: this shard's
  int kv_heads = 0;                   // this shard's key/value heads; 0: heads
  int ffn = 0;                        // the MLP's hidden width (all shards); 0: 4 d_model
  bool gated = false;                 // the MLP's first product is gate|up (SwiGLU)
  bool norm_mean = true;              // the norms keep each row's mean (LayerNorm)
  int tp = 1;
  int vocab_rows = 1;                 // this shard's rows of the padded vocabulary
  std::size_t act_bytes = 4;          // element size of the compute dtype
  std::size_t attention_state_bytes = 0;  // the backend's, for [batch, seq_len, heads]
};
// The shape of `model`'s block at micro-batch `batch`, tensor parallelism `tp` and
// activations of `act_bytes`; attention_state_bytes is the backend's to fill in.
ActivationShape model_activation_shape(const ModelConfig& model, int batch, int tp,
                                       std::size_t act_bytes);

// One row of the table.
struct ActivationEntry {
  Slot slot;
  const char* name;
  const char* shape;          // its size, in words: "N x 3C/t" (GPT-2's block)
  const char* written_by;     // "F", "B", "recv"
  bool read_by_b, read_by_w;
  bool sequence_sharded;      // rows split over tp under sequence parallelism
};
const std::vector<ActivationEntry>& activation_entries();
const ActivationEntry& activation_entry(Slot slot);

// Bytes of the slot's buffer (0 when a chunk of this kind has none).
std::size_t slot_bytes(Slot slot, const ActivationShape& shape, const ActivationPolicy& policy,
                       bool first_chunk, bool last_chunk);
// Where the slot lives for a layer run in `mode` (per-chunk slots: mode None).
Lifetime slot_lifetime(Slot slot, Recompute mode, const ActivationPolicy& policy);

// Offsets of every buffer of one chunk in its parts, 256-byte aligned.
struct ChunkActivationLayout {
  struct Where {
    Lifetime life;
    std::size_t offset, bytes;
  };
  int layers = 0;
  bool first = false, last = false;
  std::vector<Where> layer_slots;  // [layer * kLayerSlots + slot]
  std::vector<Where> chunk_slots;  // [slot - kLayerSlots]
  // Where the forward of a fully recomputed layer writes the slots B's recomputation
  // keeps for W (B..W slots written by F): the workspace. [slot]
  std::vector<Where> forward_scratch;
  // By Lifetime (Workspace: this chunk's need; Boundary: the size of one boundary array).
  std::size_t part_bytes[kLifetimes] = {0, 0, 0, 0, 0};
  const Where& at(int layer, Slot s) const {
    return is_layer_slot(s) ? layer_slots[std::size_t(layer) * kLayerSlots + std::size_t(s)]
                            : chunk_slots[std::size_t(s) - kLayerSlots];
  }
};
ChunkActivationLayout chunk_activation_layout(const ActivationShape& shape,
                                              const ActivationPolicy& policy, int layers,
                                              bool first, bool last);

// The table as text for check-config: one row per buffer of a middle layer and of the
// head, with its size in bytes at `shape` and its lifetime under `policy`.
std::string describe_activation_table(const ActivationShape& shape, const ActivationPolicy& policy);

}  // namespace pptrain
