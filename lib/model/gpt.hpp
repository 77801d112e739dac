// The GPT-2 block (a DecoderModel, decoder.hpp): LayerNorm -> packed q|k|v with bias ->
// attention -> projection -> LayerNorm -> GELU MLP, learned positions, a final LayerNorm
// and the head tied to wte. Megatron-style tensor parallelism: column-parallel c_attn and
// c_fc, row-parallel c_proj (their biases added once, after the tp sum).
#pragma once
#include <string>
#include <vector>

#include "model/decoder.hpp"

namespace pptrain {

class GptModel : public DecoderModel {
 public:
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops, const ModelPartition& part,
           comm::Group* tp = nullptr, const ActivationPolicy& policy = {},
           Master master = Master::InModel, const ContextRing& ring = {});
  GptModel(const ModelConfig& model, int batch, ops::Ops& ops)
      : GptModel(model, batch, ops, whole_model(model)) {}

 private:
  // Pointers to one layer's twelve tensors in the weight copy (P = const ops::Act*) or
  // the gradient arena (P = float*).
  template <typename P>
  struct LayerTensors {
    P ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  LayerTensors<const ops::Act*> layer_weights(int layer);
  LayerTensors<float*> layer_grads(int layer);

  void layer_forward(int layer, const LayerView& v) override;
  void layer_backward_input(int layer, const LayerView& v, bool with_weights) override;
  void layer_backward_weight(int layer, const LayerView& v) override;
  // layer_backward_weight's parts: the MLP's and the attention's weights, from the
  // gathered norm outputs they read, and the norms'.
  void mlp_weight_grads(int layer, const LayerView& v, const ops::Act* ln2);
  void attention_weight_grads(int layer, const LayerView& v, const ops::Act* ln1);
  void norm_weight_grads(int layer, const LayerView& v);
  void norm_backward(ops::Act* dinp, const ops::Act* dresidual, const ops::Act* dout,
                     const ops::Act* inp, const ops::Act* w, const float* mean, const float* rstd,
                     float* dw, float* db);
  void final_norm_forward(ops::Act* out, float* mean, float* rstd, const ops::Act* inp,
                          int rows) override;
  void final_norm_backward_input(ops::Act* dinp, const ops::Act* dout, const ops::Act* inp,
                                 const float* mean, const float* rstd, int rows) override;
  void final_norm_backward_weight(const ops::Act* dout, const ops::Act* inp, const float* mean,
                                  const float* rstd, int rows) override;
  const ops::Act* position_table() override { return weight("transformer.wpe.weight"); }
  float* position_grad() override { return grad("transformer.wpe.weight"); }
  const std::string& embedding_name() const override { return wte_; }
  const std::string& head_name() const override { return wte_; }

  const std::string wte_ = "transformer.wte.weight";
  std::vector<std::size_t> layer_offsets_;  // 12 per global layer (SIZE_MAX if not held)
};

}  // namespace pptrain
