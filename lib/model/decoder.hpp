// What every decoder-only transformer part one rank holds shares (a Model, model.hpp):
// parameters and gradients in flat arenas described by the parameter layout table, one or
// more chunks (pipeline stages) of layers, the tensor-parallel shard of each, and the
// vocab-parallel embedding, final norm, output head and cross-entropy (tp_regions.hpp;
// sequence parallelism optional). Forward keeps one micro-batch's activations in an
// Activations object, laid out by the activation table (activation_table.hpp) under the
// run's recomputation and sequence-parallel policy; backward is split into an
// input-gradient pass and a weight-gradient pass, so pipeline schedules can run the second
// later. An architecture (gpt.hpp, llama.hpp) supplies its layers' three passes, its final
// norm and its position table; all arithmetic and memory go through ops::Ops.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "core/dtype.hpp"
#include "model/activation_table.hpp"
#include "model/model.hpp"
#include "model/param_layout.hpp"
#include "model/ring_attention.hpp"
#include "model/tp_regions.hpp"
#include "ops/ops.hpp"

namespace pptrain {

class DecoderModel : public Model {
 public:
  // One micro-batch's saved values for one chunk, between its forward and its
  // weight-gradient pass (the StageModel::Set of this model). Owned by the caller; the
  // model reads and writes it.
  struct Activations;

  // `batch` is the micro-batch size in sequences. `tp` is the tensor-parallel group for
  // the backend's arrays (may be null when part.tp_size == 1).
  // `ring`: the context-parallel ring; the model then holds split.local_len() positions
  // of every sequence, piece-major (topology/sequence_split.hpp).
  DecoderModel(const ModelConfig& model, int batch, ops::Ops& ops, const ModelPartition& part,
               comm::Group* tp, const ActivationPolicy& policy, Master master,
               const ContextRing& ring = {});
  ~DecoderModel() override;

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

  // The arch's initialisation (initial_value in param_layout.hpp), each element a
  // function of (seed, tensor name, global element index). initial_parameters writes
  // every entry of a host arena of layout().total_floats() floats (the padding between
  // entries is left as it is); init_parameters sets the model's (write_params, or in
  // place).
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

 protected:
  // One layer's buffers for one pass, resolved through the chunk's layout.
  struct LayerView;
  // The arch's layer passes (backward_input's first reads v.dout, and leaves dL/dx in v.dx).
  // With `with_weights`, backward_input also computes what backward_weight would, the weight
  // gradients of each half of the layer while that half's input gradient is summed over
  // tp (Megatron's overlap of the column-parallel input gradient's all-reduce or
  // reduce-scatter with the weight-gradient GEMMs).
  virtual void layer_forward(int layer, const LayerView& v) = 0;
  virtual void layer_backward_input(int layer, const LayerView& v, bool with_weights) = 0;
  virtual void layer_backward_weight(int layer, const LayerView& v) = 0;
  // The final norm on `rows` rows (mean null when the norm keeps none), its input
  // gradient (dinp += ...) and its weight gradients.
  virtual void final_norm_forward(ops::Act* out, float* mean, float* rstd, const ops::Act* inp,
                                  int rows) = 0;
  virtual void final_norm_backward_input(ops::Act* dinp, const ops::Act* dout,
                                         const ops::Act* inp, const float* mean,
                                         const float* rstd, int rows) = 0;
  virtual void final_norm_backward_weight(const ops::Act* dout, const ops::Act* inp,
                                          const float* mean, const float* rstd, int rows) = 0;
  // The learned position table added to the embedding ([seq_len, d_model]) and its
  // gradient; null when the arch has none.
  virtual const ops::Act* position_table() { return nullptr; }
  virtual float* position_grad() { return nullptr; }
  // Names of the token embedding and of the output head (the same name when tied).
  virtual const std::string& embedding_name() const = 0;
  virtual const std::string& head_name() const = 0;

  const ops::Act* weight(const std::string& name);
  float* grad(const std::string& name);
  // The attention core of a layer (v.qkv -> v.atty, v.att_state), and its backward
  // (datty -> v.dqkv): on this rank's rows alone, or round the context-parallel ring.
  void attention_forward(const LayerView& v);
  void attention_backward(const LayerView& v, const ops::Act* datty);
  // out = residual + inp @ op(w) (+ bias when not null) for a row-parallel projection of
  // inp [N, width] into the C columns (w [width, C], or [C, width] when trans_w). Where
  // nothing is summed over tp one product adds the bias and the residual
  // (Ops::gemm_residual); else the bias is added once, after the tp sum (partial: its
  // target under SP), and then the residual.
  void row_parallel_residual(bool trans_w, const ops::Act* inp, int width, const ops::Act* w,
                             const ops::Act* bias, const ops::Act* residual, ops::Act* out,
                             ops::Act* partial);
  // Offsets of every global layer's tensors (SIZE_MAX where not held), `names` per layer:
  // layer l's k-th tensor is at offsets[l * names.size() + k].
  std::vector<std::size_t> layer_offsets(const std::vector<std::string>& names) const;
  // Call once the derived arch is constructed: sizes the activation layouts.
  void init_activation_layouts();

  ModelConfig cfg_;
  ModelPartition part_;
  SequenceSplit split_;  // the positions of every sequence this rank holds
  int B_, T_, C_;        // T_: positions held per sequence (split_.local_len())
  int NHl_, NKVl_, hs_;   // this shard's query and key/value heads, the head size
  int Vrows_, vocab_begin_;
  ops::Ops& ops_;
  DType dt_;  // the backend's compute dtype
  TensorParallelRegions tp_;
  ParamLayout layout_;

 private:
  static Activations& activations(Set& set);  // the sets this model makes
  static const Activations& activations(const Set& set);
  void* slot(Activations& a, int local, Slot s, bool forward = false) const;
  ops::Act* act(Activations& a, Slot s) const { return static_cast<ops::Act*>(slot(a, 0, s)); }
  float* f32(Activations& a, Slot s) const { return static_cast<float*>(slot(a, 0, s)); }
  enum class Pass { Forward, Input, Weight };  // F, B, W
  LayerView layer_view(Activations& a, int local, Pass pass) const;
  void lend(Activations& a, Lifetime part);
  void give_back(Activations& a, Lifetime part);
  ops::Act* boundary(Activations& a, Slot s);  // lent on first use
  bool scatters_messages() const;  // message_part() is a 1/tp share
  void recompute(int layer, int local, LayerView& v);
  void embed(Activations& a);
  void add_positions(ops::Act* x);
  float head_forward(Activations& a, float loss_scale, double* loss_total);
  void head_backward_input(Activations& a);
  void chunk_backward_weight(int chunk, Activations& a);  // head and embedding W

  ops::Buffer params_, grads_, weights_;  // weights_ empty when the compute dtype is fp32
  ActivationPolicy policy_;
  std::vector<ChunkActivationLayout> layouts_;  // per chunk
  std::vector<bool> fused_backward_;            // per chunk: B and W run layer by layer
  ops::Buffer workspace_;                       // the Workspace slots, shared by all sets
  // Spare UntilB and FromB parts, per chunk, lent to sets while they need them.
  std::vector<std::vector<ops::Buffer>> spare_until_b_, spare_from_b_;
  std::vector<ops::Buffer> spare_boundaries_;  // boundary arrays, any chunk's
  std::unique_ptr<Activations> whole_;  // activations of the single-chunk helpers
  std::unique_ptr<RingAttention> ring_;  // null without context parallelism
};

// One micro-batch's buffers for one chunk, in backend memory, laid out by
// activation_layout(chunk): Act slots in the compute dtype, statistics and losses fp32,
// tokens and targets int32.
struct DecoderModel::Activations : StageModel::Set {
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
struct DecoderModel::LayerView {
  ops::Act *x, *out;   // the layer's input and output
  ops::Act *dx, *dout; // their gradients
  // The norms' outputs (and SP-gathered copies), q|k|v, the attention's output, the
  // residual after attention, the MLP's first product and its activation.
  ops::Act *ln1, *ln1_gathered, *qkv, *atty, *partial, *res2, *ln2, *ln2_gathered, *fch, *fch_gelu;
  ops::Act *dout_gathered, *dres2, *dres2_gathered, *dfch_act, *dfch, *dln2, *dqkv, *dln1;
  ops::Act* recomputed_out;
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
  void* att_state;
};

}  // namespace pptrain
