// The GPT-2 model part one rank holds: parameters and gradients in flat arenas described
// by the parameter layout table, one or more chunks (pipeline stages) of layers, and the
// tensor-parallel shard of every layer (Megatron-style: column-parallel c_attn/c_fc,
// row-parallel c_proj, vocab-parallel embedding and cross-entropy, all-reduces over the
// tp group). Forward keeps one micro-batch's activations in an Activations object;
// backward is split into an input-gradient pass and a weight-gradient pass, so pipeline
// schedules can run the second later. All arithmetic goes through ops::Ops.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "core/aligned_buffer.hpp"
#include "model/param_layout.hpp"
#include "ops/ops.hpp"

namespace pptrain {

// Floats of activation storage (forward values and saved gradients) for one micro-batch
// of `batch` sequences through the whole (unsplit) model.
int64_t gpt_activation_floats(const ModelConfig& model, int batch);

// Training FLOPs per token (forward + backward): 6 per multiply-accumulate weight
// use, i.e. 72*L*C^2 + 6*C*Vp for the matmuls, plus 12*L*T*C for attention.
double gpt_flops_per_token(const ModelConfig& model);

class GptModel {
 public:
  // One micro-batch's saved values for one chunk, between its forward and its
  // weight-gradient pass. Owned by the caller; the model reads and writes it.
  struct Activations;

  // `batch` is the micro-batch size in sequences. `tp` is the tensor-parallel group
  // (may be null when part.tp_size == 1).
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops,
           const ModelPartition& part, comm::Group* tp = nullptr);
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops)
      : GptModel(model, batch, ops, whole_model(model)) {}
  ~GptModel();

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const ModelPartition& partition() const { return part_; }
  int batch() const { return B_; }
  int num_chunks() const { return int(part_.chunks.size()); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }

  // GPT-2 initialisation: N(0, 0.02) for weights and embeddings, residual output
  // projections N(0, 0.02/sqrt(2*n_layer)), LayerNorm weight 1, biases 0, padded vocab
  // rows 0. Each element is a function of (seed, tensor name, global element index).
  void init_parameters(uint64_t seed);
  void zero_grads();

  std::unique_ptr<Activations> new_activations(int chunk) const;

  // Forward of one chunk on a micro-batch [batch, seq_len]. A first chunk reads
  // `tokens`; any other reads `input` [batch, seq_len, d_model] (the previous stage's
  // output). A last chunk returns the mean loss over `targets`; with loss_scale > 0 it
  // prepares backward of (loss_scale * mean loss) (the fused cross-entropy turns the
  // logits into their gradient); loss_scale == 0 is evaluation only. Other chunks return
  // 0 and leave their output in output(a).
  float forward(int chunk, Activations& a, const int32_t* tokens, const float* input,
                const int32_t* targets, float loss_scale);
  // The single-chunk whole model: forward on tokens/targets.
  float forward(const int32_t* tokens, const int32_t* targets, float loss_scale = 0.0f);

  // Input gradients through the chunk, after a training forward. A non-last chunk first
  // needs the gradient of its output written to output_grad(a).
  void backward_input(int chunk, Activations& a);
  // Weight gradients of the chunk, accumulated into grads(); after backward_input.
  void backward_weight(int chunk, Activations& a);
  void backward_input();   // single-chunk whole model
  void backward_weight();  // single-chunk whole model

  float* input_buffer(Activations& a) const;         // where a non-first chunk's input is received
  const float* output(const Activations& a) const;   // [B,T,C] to send forward
  float* output_grad(Activations& a) const;          // where dL/d(output) is received
  const float* input_grad(const Activations& a) const;  // [B,T,C] dL/d(input) to send back
  // Per-position losses [batch, seq_len] of a last chunk's forward.
  const float* position_losses(const Activations& a) const;
  const float* position_losses() const;  // single-chunk whole model

 private:
  // Pointers to one layer's twelve tensors in the parameter or gradient arena.
  struct LayerTensors {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b,
        *fcproj_w, *fcproj_b;
  };
  LayerTensors layer_tensors(float* arena, int layer) const;
  float* tensor(float* arena, const char* name) const;
  void all_reduce_tp(float* data, std::size_t n);
  void layer_forward(int layer, Activations& a, int local);
  void layer_backward_input(int layer, Activations& a, int local);
  void layer_backward_weight(int layer, Activations& a, int local);
  void embed(Activations& a);
  float head_forward(Activations& a, float loss_scale);
  void head_backward_input(Activations& a);

  ModelConfig cfg_;
  ModelPartition part_;
  int B_, T_, C_, Cl_, NH_, NHl_, Vrows_, vocab_begin_;
  ops::Ops& ops_;
  comm::Group* tp_;
  ParamLayout layout_;
  AlignedBuffer<float> params_, grads_;
  std::vector<std::size_t> layer_offsets_;  // 12 offsets per global layer (if held)
  std::unique_ptr<Activations> whole_;      // activations of the single-chunk helpers
};

struct GptModel::Activations {
  struct Layer {
    AlignedBuffer<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd,
        fch, fch_gelu;
    AlignedBuffer<float> dres2, dfch, dln2, dqkv, dln1;  // output gradients for the W pass
  };
  std::vector<int32_t> tokens, targets;
  std::vector<AlignedBuffer<float>> x;   // x[i]: input of the chunk's i-th layer; x[n]: output
  std::vector<AlignedBuffer<float>> dx;  // gradients w.r.t. x[i]
  std::vector<Layer> layers;
  AlignedBuffer<float> lnf, lnf_mean, lnf_rstd, logits, losses, dlnf, ce_max, ce_stats;
};

}  // namespace pptrain
