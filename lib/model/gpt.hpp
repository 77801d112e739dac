// The GPT-2 model on one rank: parameters and gradients in flat arenas described by
// the parameter layout table, activations for one micro-batch, and the forward pass
// plus a backward split into an input-gradient pass and a weight-gradient pass
// (1F1B runs them back to back; zero-bubble schedules will move the second).
// All arithmetic goes through the ops::Ops backend interface.
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.hpp"
#include "core/aligned_buffer.hpp"
#include "model/param_layout.hpp"
#include "ops/ops.hpp"

namespace pptrain {

// Floats of activation storage (forward values and saved gradients) for one
// micro-batch of `batch` sequences.
int64_t gpt_activation_floats(const ModelConfig& model, int batch);

// Training FLOPs per token (forward + backward): 6 per multiply-accumulate weight
// use, i.e. 72*L*C^2 + 6*C*Vp for the matmuls, plus 12*L*T*C for attention.
double gpt_flops_per_token(const ModelConfig& model);

class GptModel {
 public:
  // `batch` is the micro-batch size in sequences; every call works on batch x seq_len tokens.
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops);

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  int batch() const { return B_; }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }

  // GPT-2 initialisation: N(0, 0.02) for weights and embeddings, residual output
  // projections N(0, 0.02/sqrt(2*n_layer)), LayerNorm weight 1, biases 0, padded vocab
  // rows 0. Each element is a function of (seed, tensor name, element index).
  void init_parameters(uint64_t seed);
  void zero_grads();

  // Forward on inputs/targets [batch, seq_len]; returns the mean loss. With
  // loss_scale > 0 it prepares backward of (loss_scale * mean loss): the activations
  // are kept and the logits are turned into their gradient in place (fused
  // cross-entropy). loss_scale == 0 is evaluation only.
  float forward(const int32_t* inputs, const int32_t* targets, float loss_scale = 0.0f);
  // Input gradients through every layer, after forward with loss_scale > 0; saves the
  // output gradients the weight pass needs.
  void backward_input();
  // Weight gradients, accumulated into grads(); call after backward_input.
  void backward_weight();
  // Per-position losses [batch, seq_len] of the last forward.
  const float* position_losses() const { return losses_.data(); }

 private:
  struct LayerActs {
    AlignedBuffer<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean,
        ln2_rstd, fch, fch_gelu;
    // Saved output gradients for the weight pass.
    AlignedBuffer<float> dres2, dfch, dln2, dqkv, dln1;
  };
  // Pointers to one layer's twelve tensors, in layout order, in the parameter or
  // gradient arena.
  struct LayerTensors {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b,
        *fcproj_w, *fcproj_b;
  };
  LayerTensors layer_tensors(float* arena, int l) const;
  float* tensor(float* arena, const char* name) const;
  void layer_forward(int l);
  void layer_backward_input(int l);
  void layer_backward_weight(int l);

  ModelConfig cfg_;
  int B_, T_, C_, NH_, Vp_;
  ops::Ops& ops_;
  ParamLayout layout_;
  AlignedBuffer<float> params_, grads_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<AlignedBuffer<float>> x_;   // x_[l]: input of layer l; x_[L]: final residual
  std::vector<AlignedBuffer<float>> dx_;  // gradients w.r.t. x_[l]
  std::vector<LayerActs> layers_;
  AlignedBuffer<float> lnf_, lnf_mean_, lnf_rstd_, logits_, losses_, dlnf_;
};

}  // namespace pptrain
