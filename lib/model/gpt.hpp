// The GPT-2 model part one rank holds: parameters and gradients in flat arenas described
// by the parameter layout table, one or more chunks (pipeline stages) of layers, and the
// tensor-parallel shard of every layer (Megatron-style: column-parallel c_attn/c_fc,
// row-parallel c_proj, vocab-parallel embedding and cross-entropy, all-reduces over the
// tp group). Forward keeps one micro-batch's activations in an Activations object;
// backward is split into an input-gradient pass and a weight-gradient pass, so pipeline
// schedules can run the second later. All arithmetic and all memory go through ops::Ops:
// every array lives in the backend's memory (GPU memory on CUDA).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "core/dtype.hpp"
#include "model/param_layout.hpp"
#include "ops/ops.hpp"

namespace pptrain {

// Floats of activation storage (forward values and saved gradients) for one micro-batch
// of `batch` sequences through the whole (unsplit) model.
double gpt_activation_floats(const ModelConfig& model, int batch);

// Training FLOPs per token (forward + backward): 6 per multiply-accumulate weight
// use, i.e. 72*L*C^2 + 6*C*Vp for the matmuls, plus 12*L*T*C for attention.
double gpt_flops_per_token(const ModelConfig& model);

class GptModel {
 public:
  // One micro-batch's saved values for one chunk, between its forward and its
  // weight-gradient pass. Owned by the caller; the model reads and writes it.
  struct Activations;

  // `batch` is the micro-batch size in sequences. `tp` is the tensor-parallel group for
  // the backend's arrays (may be null when part.tp_size == 1).
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops,
           const ModelPartition& part, comm::Group* tp = nullptr);
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops)
      : GptModel(model, batch, ops, whole_model(model)) {}
  ~GptModel();

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const ModelPartition& partition() const { return part_; }
  ops::Ops& backend() const { return ops_; }
  int batch() const { return B_; }
  int num_chunks() const { return int(part_.chunks.size()); }
  // The fp32 master parameters and the fp32 gradients, in backend memory, laid out by
  // layout(); weights() is the copy the forward computes with, in the backend's compute
  // dtype (the master itself when that is fp32).
  float* params() { return params_.f32(); }
  float* grads() { return grads_.f32(); }
  ops::Act* weights() { return weights_.get() ? weights_.act() : ops::as_act(params_.f32()); }
  bool has_weight_copy() const { return weights_.get() != nullptr; }
  // Host copies of the master parameters (layout().total_floats() floats). write_params
  // also refreshes weights().
  void read_params(float* host) const;
  void write_params(const float* host);
  // weights() = params() in the compute dtype (after an update of params()).
  void refresh_weights();

  // GPT-2 initialisation: N(0, 0.02) for weights and embeddings, residual output
  // projections N(0, 0.02/sqrt(2*n_layer)), LayerNorm weight 1, biases 0, padded vocab
  // rows 0. Each element is a function of (seed, tensor name, global element index).
  void init_parameters(uint64_t seed);
  void zero_grads();

  std::unique_ptr<Activations> new_activations(int chunk) const;
  // Bytes of one stage-boundary array [batch, seq_len, d_model] (what is sent between stages).
  std::size_t boundary_bytes() const;

  // Forward of one chunk on a micro-batch [batch, seq_len]. A first chunk reads `tokens`
  // (host memory); any other reads `input` [batch, seq_len, d_model] (backend memory: the
  // previous stage's output). A last chunk returns the mean loss over `targets` (host
  // memory); with loss_scale > 0 it prepares backward of (loss_scale * mean loss) (the
  // fused cross-entropy turns the logits into their gradient); loss_scale == 0 is
  // evaluation only. Other chunks return 0 and leave their output in output(a).
  float forward(int chunk, Activations& a, const int32_t* tokens, const ops::Act* input,
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

  // Stage-boundary arrays in backend memory, boundary_bytes() each.
  ops::Act* input_buffer(Activations& a) const;         // where a non-first chunk's input is received
  ops::Act* output(Activations& a) const;               // [B,T,C] to send forward
  ops::Act* output_grad(Activations& a) const;          // where dL/d(output) is received
  ops::Act* input_grad(Activations& a) const;           // [B,T,C] dL/d(input) to send back
  // Per-position losses [batch, seq_len] (host copy) of a last chunk's forward.
  const std::vector<float>& position_losses(const Activations& a) const;
  const std::vector<float>& position_losses() const;  // single-chunk whole model

 private:
  // Pointers to one layer's twelve tensors in the weight copy (P = const ops::Act*) or
  // the gradient arena (P = float*).
  template <typename P>
  struct LayerTensors {
    P ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  LayerTensors<const ops::Act*> layer_weights(int layer);
  LayerTensors<float*> layer_grads(int layer);
  const ops::Act* weight(const char* name);
  float* grad(const char* name);
  void all_reduce_tp(ops::Act* data, std::size_t n);
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
  DType dt_;  // the backend's compute dtype
  comm::Group* tp_;
  ParamLayout layout_;
  ops::Buffer params_, grads_, weights_;  // weights_ empty when the compute dtype is fp32
  std::vector<std::size_t> layer_offsets_;  // 12 offsets per global layer (if held)
  std::unique_ptr<Activations> whole_;      // activations of the single-chunk helpers
};

// Arrays in backend memory: Act ones in the compute dtype, the statistics and losses fp32,
// tokens and targets int32.
struct GptModel::Activations {
  struct Layer {
    ops::Buffer ln1, ln1_mean, ln1_rstd, qkv, att_state, atty, res2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu;
    ops::Buffer dres2, dfch, dln2, dqkv, dln1;  // output gradients for the W pass
  };
  ops::Buffer tokens, targets;
  std::vector<ops::Buffer> x;   // x[i]: input of the chunk's i-th layer; x[n]: output
  std::vector<ops::Buffer> dx;  // gradients w.r.t. x[i]
  std::vector<Layer> layers;
  ops::Buffer lnf, lnf_mean, lnf_rstd, logits, losses, dlnf, ce_max, ce_stats;
  std::vector<float> host_losses;  // losses, copied to the host by the forward
};

}  // namespace pptrain
