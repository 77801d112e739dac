// The GPT-2 model part one rank holds (a Model, model.hpp): parameters and gradients in
// flat arenas described by the parameter layout table, one or more chunks (pipeline
// stages) of layers, and the tensor-parallel shard of every layer (Megatron-style:
// column-parallel c_attn/c_fc, row-parallel c_proj, vocab-parallel embedding and
// cross-entropy; the tp collectives are the regions of tp_regions.hpp, with sequence
// parallelism optional). Forward keeps one micro-batch's activations in an Activations
// object, laid out by the activation table (activation_table.hpp) under the run's recomputation and
// sequence-parallel policy; backward is split into an input-gradient pass and a
// weight-gradient pass, so pipeline schedules can run the second later. All arithmetic
// and all memory go through ops::Ops: every array lives in the backend's memory (GPU
// memory on CUDA).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "core/dtype.hpp"
#include "model/activation_table.hpp"
#include "model/model.hpp"
#include "model/param_layout.hpp"
#include "model/tp_regions.hpp"
#include "ops/ops.hpp"

namespace pptrain {

// Training FLOPs per token (forward + backward): 6 per multiply-accumulate weight
// use, i.e. 72*L*C^2 + 6*C*Vp for the matmuls, plus 12*L*T*C for attention.
double gpt_flops_per_token(const ModelConfig& model);

class GptModel : public Model {
 public:
  // One micro-batch's saved values for one chunk, between its forward and its
  // weight-gradient pass (the StageModel::Set of this model). Owned by the caller; the
  // model reads and writes it.
  struct Activations;

  // `batch` is the micro-batch size in sequences. `tp` is the tensor-parallel group for
  // the backend's arrays (may be null when part.tp_size == 1).
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops, const ModelPartition& part,
           comm::Group* tp = nullptr, const ActivationPolicy& policy = {},
           Master master = Master::InModel);
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops)
      : GptModel(model, batch, ops, whole_model(model)) {}
  ~GptModel() override;

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const override { return layout_; }
  const ModelPartition& partition() const override { return part_; }
  ops::Ops& backend() const override { return ops_; }
  int batch() const { return B_; }
  std::size_t micro_batch_tokens() const override { return std::size_t(B_) * std::size_t(T_); }
  const ActivationPolicy& policy() const { return policy_; }
  // The sizes the activation table is evaluated at for this rank.
  ActivationShape activation_shape() const;
  const ChunkActivationLayout& activation_layout(int chunk) const {
    return layouts_.at(std::size_t(chunk));
  }
  // The arenas (model.hpp); weights() is the master itself when the compute dtype is fp32.
  float* params() override { return params_.f32(); }
  float* grads() override { return grads_.f32(); }
  ops::Act* weights() override {
    return weights_.get() ? weights_.act() : ops::as_act(params_.f32());
  }
  bool has_weight_copy() const override { return weights_.get() != nullptr; }
  // Without a master, write_params stages the values through the gradient arena (which
  // it leaves zeroed).
  void read_params(float* host) const override;
  void write_params(const float* host) override;
  // weights() = params() in the compute dtype (after an update of params()).
  void refresh_weights();

  // GPT-2 initialisation: N(0, 0.02) for weights and embeddings, residual output
  // projections N(0, 0.02/sqrt(2*n_layer)), LayerNorm weight 1, biases 0, padded vocab
  // rows 0. Each element is a function of (seed, tensor name, global element index).
  // initial_parameters writes every entry of a host arena of layout().total_floats()
  // floats (the padding between entries is left as it is); init_parameters sets the
  // model's (write_params, or in place).
  void initial_parameters(uint64_t seed, float* host) const override;
  void init_parameters(uint64_t seed) override;
  void zero_grads() override;

  // A chunk's set: its kept buffers. The buffers kept only until B, or only from B to W,
  // are lent from the model's spares while needed; release_parts returns them once W
  // is done. The boundary arrays are lent one by one (Lifetime::Boundary) from their
  // first use; release_boundaries returns what a set holds of them (once no send reads
  // them), return_boundary one of them (Slot::output, output_grad or input_grad).
  std::unique_ptr<Activations> new_activations(int chunk) const;
  std::unique_ptr<Set> new_set(int chunk) override;
  void release_parts(Set& set) override;
  void release_boundaries(Set& set) override;
  void return_boundary(Set& set, Slot s) override;
  // A hop between chunks on this rank writes straight into the other set's array: the
  // forward's output into the next chunk's input_buffer, the input gradient into the
  // previous chunk's output_grad.
  void output_into(Set& set, ops::Act* next_input) override;
  void input_grad_into(Set& set, ops::Act* previous_output_grad) override;
  // Bytes of one stage-boundary array: the [batch * seq_len, d_model] rows this rank holds
  // (N / tp of them under sequence parallelism), what is sent between stages.
  std::size_t boundary_bytes() const override;
  // The part of a boundary array this rank sends or receives between stages, as a byte
  // offset and length. Without sequence parallelism every tp rank holds the whole array,
  // so each sends only its 1/tp share and the receiver all-gathers it over tp
  // (complete_message), as Megatron's scatter/gather; else the whole array.
  std::pair<std::size_t, std::size_t> message_part() const override;
  // After a receive of message_part() into `boundary`: the whole array.
  void complete_message(ops::Act* boundary) override;

  // Forward of one chunk on a micro-batch [batch, seq_len]. A first chunk reads `tokens`
  // (host memory); any other reads `input`, boundary_bytes() (backend memory: the
  // previous stage's output). A last chunk returns the mean loss over `targets` (host
  // memory); with loss_scale > 0 it prepares backward of (loss_scale * mean loss) (the
  // fused cross-entropy turns the logits into their gradient); loss_scale == 0 is
  // evaluation only. Other chunks return 0 and leave their output in output(a). With
  // `loss_total` (backend memory, one fp64) a last chunk adds its mean loss there
  // (ops::Ops::add_mean) instead, without waiting for it, and returns 0.
  float forward(int chunk, Set& set, const int32_t* tokens, const ops::Act* input,
                const int32_t* targets, float loss_scale, double* loss_total = nullptr) override;
  // The single-chunk whole model: forward on tokens/targets.
  float forward(const int32_t* tokens, const int32_t* targets, float loss_scale = 0.0f);

  // Input gradients through the chunk, after a training forward. A non-last chunk first
  // needs the gradient of its output written to output_grad(a). A chunk with fully
  // recomputed layers, when W follows B (policy().weight_follows_input), runs each
  // layer's W right after its B here, from one layer's workspace.
  // `layer_done`, when set, is called with each layer once its weight gradients are
  // queued, from whichever of the two passes runs them.
  void backward_input(int chunk, Set& set, const LayerFn& layer_done = {}) override;
  // Weight gradients of the chunk, accumulated into grads(); after backward_input (a
  // no-op when backward_input already ran them).
  void backward_weight(int chunk, Set& set, const LayerFn& layer_done = {}) override;
  void backward_input();   // single-chunk whole model
  void backward_weight();  // single-chunk whole model

  // Stage-boundary arrays in backend memory, boundary_bytes() each; the last three are
  // lent to the set when first asked for.
  ops::Act* input_buffer(Set& set) const override;  // where a non-first chunk's input is received
  ops::Act* output(Set& set) override;              // the held rows, sent forward
  ops::Act* output_grad(Set& set) override;         // where dL/d(output) is received
  ops::Act* input_grad(Set& set) override;          // dL/d(input), sent back
  // Per-position losses [batch, seq_len] (host copy) of a last chunk's forward.
  const std::vector<float>& position_losses(const Set& set) const override;
  const std::vector<float>& position_losses() const;  // single-chunk whole model

 private:
  // Pointers to one layer's twelve tensors in the weight copy (P = const ops::Act*) or
  // the gradient arena (P = float*).
  template <typename P>
  struct LayerTensors {
    P ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  // One layer's buffers for one pass, resolved through the chunk's layout.
  struct LayerView;
  LayerTensors<const ops::Act*> layer_weights(int layer);
  LayerTensors<float*> layer_grads(int layer);
  const ops::Act* weight(const char* name);
  float* grad(const char* name);
  static Activations& activations(Set& set);  // the sets this model makes
  static const Activations& activations(const Set& set);
  void* slot(Activations& a, int local, Slot s, bool forward = false) const;
  ops::Act* act(Activations& a, Slot s) const { return static_cast<ops::Act*>(slot(a, 0, s)); }
  float* f32(Activations& a, Slot s) const { return static_cast<float*>(slot(a, 0, s)); }
  enum class Pass { Forward, Input, Weight };  // F, B, W
  LayerView layer_view(Activations& a, int local, Pass pass) const;
  void init_activation_layouts();
  void lend(Activations& a, Lifetime part);
  void give_back(Activations& a, Lifetime part);
  ops::Act* boundary(Activations& a, Slot s);  // lent on first use
  bool scatters_messages() const;  // message_part() is a 1/tp share
  void layer_forward(int layer, const LayerView& v);
  void layer_backward_input(int layer, const LayerView& v);
  void layer_backward_weight(int layer, const LayerView& v);
  void recompute(int layer, int local, LayerView& v);
  void embed(Activations& a);
  void add_positions(ops::Act* x);
  float head_forward(Activations& a, float loss_scale, double* loss_total);
  void head_backward_input(Activations& a);
  void chunk_backward_weight(int chunk, Activations& a);  // head and embedding W

  ModelConfig cfg_;
  ModelPartition part_;
  int B_, T_, C_, Cl_, NH_, NHl_, Vrows_, vocab_begin_;
  ops::Ops& ops_;
  DType dt_;  // the backend's compute dtype
  TensorParallelRegions tp_;
  ParamLayout layout_;
  ops::Buffer params_, grads_, weights_;  // weights_ empty when the compute dtype is fp32
  std::vector<std::size_t> layer_offsets_;  // 12 offsets per global layer (if held)
  ActivationPolicy policy_;
  std::vector<ChunkActivationLayout> layouts_;  // per chunk
  std::vector<bool> fused_backward_;            // per chunk: B and W run layer by layer
  ops::Buffer workspace_;                       // the Workspace slots, shared by all sets
  // Spare UntilB and FromB parts, per chunk, lent to sets while they need them.
  std::vector<std::vector<ops::Buffer>> spare_until_b_, spare_from_b_;
  std::vector<ops::Buffer> spare_boundaries_;  // boundary arrays, any chunk's
  std::unique_ptr<Activations> whole_;  // activations of the single-chunk helpers
};

// One micro-batch's buffers for one chunk, in backend memory, laid out by
// activation_layout(chunk): Act slots in the compute dtype, statistics and losses fp32,
// tokens and targets int32.
struct GptModel::Activations : StageModel::Set {
  int chunk = 0;
  ops::Buffer set;               // the Set slots
  ops::Buffer until_b, from_b;   // the UntilB and FromB slots, lent by the model
  // The boundary arrays (output, output_grad, input_grad): null until first used, then
  // the model's buffer lent to the set (in `lent`) or another set's array (a hop).
  ops::Act* boundaries[3] = {nullptr, nullptr, nullptr};
  ops::Buffer lent[3];
  bool weight_done = false;      // backward_input already ran W (fused)
  std::vector<float> host_losses;  // losses, copied to the host by the forward
};

// One layer's buffers as one pass sees them (null where the table gives none).
struct GptModel::LayerView {
  ops::Act *x, *out;   // the layer's input and output
  ops::Act *dx, *dout; // their gradients
  ops::Act *ln1, *ln1_gathered, *qkv, *atty, *partial, *res2, *ln2, *ln2_gathered, *fch, *fch_gelu;
  ops::Act *dout_gathered, *dres2, *dres2_gathered, *dfch, *dln2, *dqkv, *dln1, *recomputed_out;
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
  void* att_state;
};

}  // namespace pptrain
