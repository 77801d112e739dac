// The parameter layout table: every tensor this rank holds, under its Hugging Face
// name (GPT2LMHeadModel's or LlamaForCausalLM's), with its local shape, how it is sliced
// out of the global tensor (tensor parallelism), and its offset in one flat fp32 arena. Parameters, gradients
// and optimizer moments all use the same table, so the optimizer, the checkpoint and
// the data-parallel gradient reduction agree on where each tensor lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace pptrain {

struct ParamEntry {
  std::string name;               // e.g. "transformer.h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;     // local shape stored in the arena
  std::vector<int64_t> hf_shape;  // global shape in a Hugging Face checkpoint
  std::size_t offset = 0;         // in floats from the arena start; 256-byte aligned
  std::size_t numel = 0;          // product of `shape`
  bool decay = false;             // AdamW weight decay applies (2-D weights, embeddings)
  // Tensor-parallel slicing: the global tensor, padded to shape[split_dim] * num_shards
  // along split_dim (wte's vocab padding), is cut into split_groups equal groups along
  // split_dim (3 for q|k|v), and this rank holds the shard-th of num_shards chunks of
  // every group. split_dim -1: the whole tensor (replicated across tp ranks).
  int split_dim = -1;
  int split_groups = 1;
  int shard = 0;
  int num_shards = 1;
  // A second copy of a tensor another rank also holds (the tied token embedding on the
  // last pipeline stage): its gradient is summed with the first copy's and it is left
  // out of norms and checkpoints.
  bool tied_copy = false;
  // A norm's tensor (LayerNorm, RMSNorm): under sequence parallelism each tp rank's gradient covers its own
  // token rows only, and the gradients are summed over tp before the norm and the update.
  bool layer_norm = false;
  std::size_t hf_numel() const;   // product of `hf_shape`
  bool replicated() const { return split_dim < 0; }
};

class ParamLayout {
 public:
  // A run of the arena whose gradients are final at once: a layer (layer >= 0), or a
  // chunk's embeddings or its head (layer -1), from `begin` to the next group's begin.
  struct Group {
    int chunk, layer;
    std::size_t begin;
  };

  // Appends a tensor; `hf_shape` empty means the same as `shape`. Returns the entry. A
  // `packed` entry starts where the previous one ends (no alignment gap), so one product
  // can read or write several tensors as one (llama's q|k|v, gate|up).
  ParamEntry& add(const std::string& name, std::vector<int64_t> shape, bool decay,
                  std::vector<int64_t> hf_shape = {}, bool packed = false);
  // Starts a group at the next aligned offset; the entries added after belong to it.
  void begin_group(int chunk, int layer);
  const std::vector<Group>& groups() const { return groups_; }
  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry& at(const std::string& name) const;  // throws std::out_of_range
  bool contains(const std::string& name) const;
  std::size_t total_floats() const { return total_; }   // arena size including alignment gaps
  // Pads the arena's end to a multiple of `floats`; the next entry starts there.
  void pad_to(std::size_t floats);
  int64_t hf_param_count() const;                       // real parameters (GPT-2 shapes)

 private:
  std::vector<ParamEntry> entries_;
  std::vector<Group> groups_;
  std::size_t total_ = 0;
};

// Which part of the model a rank holds: one or more chunks (virtual pipeline stages),
// each a range of layers, plus its tensor-parallel shard.
struct ChunkSpec {
  int layer_begin = 0, layer_end = 0;  // layers [begin, end)
  bool first = true;                   // holds the embeddings (input: tokens)
  bool last = true;                    // holds the final norm and the head (computes the loss)
};
struct ModelPartition {
  std::vector<ChunkSpec> chunks;  // empty: the whole model in one chunk
  int tp_rank = 0, tp_size = 1;
  bool tied_copy_on_last = false;  // the head's wte is a copy (pp > 1)
  // Each layer's tensors, and each chunk's leading embeddings and trailing head, start
  // and end on a multiple of this many floats (grad_buckets.hpp: ZeRO-1 splits every
  // gradient bucket evenly over the data-parallel ranks, in place).
  std::size_t group_floats = 1;
};

// The whole model on one rank.
ModelPartition whole_model(const ModelConfig& model);

// Vocabulary rows per tensor-parallel shard: the vocab padded to a multiple of
// 128 * tp_size, divided by tp_size.
int vocab_rows_per_shard(const ModelConfig& model, int tp_size);

// The tensors of `model`'s arch for the chunks and tensor-parallel shard of `part`, in
// Hugging Face names. GPT-2: Conv1D weights stored (in, out) as GPT-2 checkpoints do,
// column-parallel c_attn and c_fc, row-parallel attn/mlp c_proj, the LM head tied to
// wte. Llama: nn.Linear weights stored (out, in), column-parallel q/k/v_proj (query and
// key/value heads) and gate/up_proj, row-parallel o_proj and down_proj, lm_head its own
// tensor unless tied. Vocab-parallel embeddings and head; everything else replicated.
ParamLayout param_layout(const ModelConfig& model, const ModelPartition& part);
inline ParamLayout param_layout(const ModelConfig& model) {
  return param_layout(model, whole_model(model));
}
// "transformer.h.3." (GPT-2), "model.layers.3." (llama): the prefix of a layer's tensors.
std::string layer_prefix(Arch arch, int layer);
// The token embedding's name (also the head's when tied).
const std::string& embedding_name(Arch arch);

// The training FLOPs per token (forward + backward): 6 per multiply-accumulate of a
// weight (each layer's projections and MLP, the head), plus 12 * L * T * C for the
// attention products (causal masking not discounted). GPT-2: 72 L C^2 + 6 C Vp + 12 L T C.
double flops_per_token(const ModelConfig& model);

// Copies between an entry's local slice and the global tensor (hf_shape; rows of
// the padded global tensor beyond hf_shape are padding: zero when read, dropped when
// written). `global` holds hf_numel floats.
void slice_from_global(const ParamEntry& e, const float* global, float* local);
// local[i] = value(global index of local element i), 0 for padding.
void fill_from_global(const ParamEntry& e, const std::function<float(int64_t)>& value,
                      float* local);
// values(first, count, out) writes out[k] = value of global element first + k; the same
// as fill_from_global, a run at a time (runs of up to 16384 elements).
void fill_runs_from_global(const ParamEntry& e,
                           const std::function<void(int64_t, int64_t, float*)>& values,
                           float* local);
void slice_to_global(const ParamEntry& e, const float* local, float* global);

}  // namespace pptrain
