// The Llama block (a DecoderModel, decoder.hpp), in Hugging Face LlamaForCausalLM's
// conventions: RMSNorm -> q|k|v (grouped-query: n_kv_head key/value heads) -> rotary
// embedding on q and k (rotate-half) -> attention -> o_proj, then RMSNorm -> SwiGLU MLP
// (gate, up, down); no biases, no learned positions, a final RMSNorm and an output head
// tied to the embedding or its own. Tensor parallelism splits query heads, key/value
// heads and the MLP's columns (q/k/v, gate/up column-parallel; o_proj, down_proj
// row-parallel). Weights are nn.Linear's (out, in), so every product multiplies by the
// transpose.
#pragma once
#include <string>
#include <vector>

#include "model/decoder.hpp"

namespace pptrain {

class LlamaModel : public DecoderModel {
 public:
  LlamaModel(const ModelConfig& model, int batch, ops::Ops& ops, const ModelPartition& part,
             comm::Group* tp = nullptr, const ActivationPolicy& policy = {},
             Master master = Master::InModel, const ContextRing& ring = {});

 private:
  // One layer's tensors in the weight copy (P = const ops::Act*) or the gradient arena
  // (P = float*); qkv is q_proj with k_proj and v_proj packed after it, gate_up
  // gate_proj with up_proj.
  template <typename P>
  struct LayerTensors {
    P ln1, qkv, o, ln2, gate_up, down;
  };
  template <typename P>
  LayerTensors<P> layer_tensors(int layer, P arena) const;

  void layer_forward(int layer, const LayerView& v) override;
  void layer_backward_input(int layer, const LayerView& v, bool with_weights) override;
  void layer_backward_weight(int layer, const LayerView& v) override;
  // layer_backward_weight's parts: the MLP's and the attention's weights, from the
  // gathered norm outputs they read, and the norms'.
  void mlp_weight_grads(int layer, const LayerView& v, const ops::Act* ln2);
  void attention_weight_grads(int layer, const LayerView& v, const ops::Act* ln1);
  void norm_weight_grads(int layer, const LayerView& v);
  void norm_backward(ops::Act* dinp, const ops::Act* dresidual, const ops::Act* dout,
                     const ops::Act* inp, const ops::Act* w, const float* rstd, float* dw);
  void final_norm_forward(ops::Act* out, float* mean, float* rstd, const ops::Act* inp,
                          int rows) override;
  void final_norm_backward_input(ops::Act* dinp, const ops::Act* dout, const ops::Act* inp,
                                 const float* mean, const float* rstd, int rows) override;
  void final_norm_backward_weight(const ops::Act* dout, const ops::Act* inp, const float* mean,
                                  const float* rstd, int rows) override;
  const std::string& embedding_name() const override { return embedding_; }
  const std::string& head_name() const override { return head_; }
  void rope(ops::Act* qkv, bool inverse);  // on the q and k heads of every row

  int W_;   // this shard's q|k|v width: (heads + 2 kv heads) * head size
  int Fl_;  // this shard's MLP columns
  float eps_;
  const std::string embedding_, head_, norm_ = "model.norm.weight";
  std::vector<std::size_t> layer_offsets_;  // 6 per global layer (SIZE_MAX if not held)
};

}  // namespace pptrain
