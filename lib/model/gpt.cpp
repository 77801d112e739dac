// GPT-2's layers, final LayerNorm and construction. LayerNorms, biases after
// row-parallel linears and residual adds run on the rows this rank holds; the linears and
// attention on all N rows (tp_regions.hpp).
#include "model/gpt.hpp"

#include "core/error.hpp"

namespace pptrain {

namespace {
const std::vector<std::string> kLayerTensorNames = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
}  // namespace

GptModel::GptModel(const ModelConfig& model, int batch, ops::Ops& ops, const ModelPartition& part,
                   comm::Group* tp, const ActivationPolicy& policy, Master master,
                   const ContextRing& ring)
    : DecoderModel(model, batch, ops, part, tp, policy, master, ring),
      layer_offsets_(layer_offsets(kLayerTensorNames)) {
  PPTRAIN_CHECK(model.arch == Arch::Gpt2 && kv_heads(model) == model.n_head &&
                    ffn_width(model) == 4 * model.d_model && model.tie_embeddings,
                "not a GPT-2 shape");
  init_activation_layouts();
}

GptModel::LayerTensors<const ops::Act*> GptModel::layer_weights(int layer) {
  const size_t* o = &layer_offsets_[size_t(layer) * kLayerTensorNames.size()];
  PPTRAIN_CHECK(o[0] != SIZE_MAX, "layer not held by this rank");
  const ops::Act* w = weights();
  auto at = [&](int k) { return ops::advance(w, o[k], dt_); };
  return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11)};
}

GptModel::LayerTensors<float*> GptModel::layer_grads(int layer) {
  const size_t* o = &layer_offsets_[size_t(layer) * kLayerTensorNames.size()];
  PPTRAIN_CHECK(o[0] != SIZE_MAX, "layer not held by this rank");
  float* g = grads();
  return {g + o[0], g + o[1], g + o[2], g + o[3], g + o[4],  g + o[5],
          g + o[6], g + o[7], g + o[8], g + o[9], g + o[10], g + o[11]};
}

void GptModel::final_norm_forward(ops::Act* out, float* mean, float* rstd, const ops::Act* inp,
                                  int rows) {
  ops_.layernorm_forward(out, mean, rstd, inp, weight("transformer.ln_f.weight"),
                         weight("transformer.ln_f.bias"), rows, C_);
}

void GptModel::final_norm_backward_input(ops::Act* dinp, const ops::Act* dout,
                                         const ops::Act* inp, const float* mean,
                                         const float* rstd, int rows) {
  ops_.layernorm_backward_input(dinp, dinp, dout, inp, weight("transformer.ln_f.weight"), mean,
                                rstd, rows, C_);
}

void GptModel::final_norm_backward_weight(const ops::Act* dout, const ops::Act* inp,
                                          const float* mean, const float* rstd, int rows) {
  ops_.layernorm_backward_weight(grad("transformer.ln_f.weight"), grad("transformer.ln_f.bias"),
                                 dout, inp, mean, rstd, rows, C_);
}

void GptModel::layer_forward(int l, const LayerView& v) {
  const int Nh = tp_.rows_held(), C = C_, Cl = NHl_ * hs_;
  const auto w = layer_weights(l);
  ops_.layernorm_forward(v.ln1, v.ln1_mean, v.ln1_rstd, v.x, w.ln1_w, w.ln1_b, Nh, C);
  // Each tp collective travels row block by row block beside its GEMM's other blocks
  // (gather_rows, reduce_rows).
  tp_.gather_rows(v.ln1, v.ln1_gathered, C, [&](int first, int rows, const ops::Act* ln1) {
    ops_.linear_forward(tp_.row(v.qkv, first, 3 * Cl), nullptr, ln1, w.qkv_w, w.qkv_b, rows, C,
                        3 * Cl);
  });
  attention_forward(v);
  row_parallel_residual(false, v.atty, Cl, w.proj_w, w.proj_b, v.x, v.res2, v.partial);
  ops_.layernorm_forward(v.ln2, v.ln2_mean, v.ln2_rstd, v.res2, w.ln2_w, w.ln2_b, Nh, C);
  tp_.gather_rows(v.ln2, v.ln2_gathered, C, [&](int first, int rows, const ops::Act* ln2) {
    ops_.linear_forward(tp_.row(v.fch, first, 4 * Cl), tp_.row(v.fch_gelu, first, 4 * Cl), ln2,
                        w.fc_w, w.fc_b, rows, C, 4 * Cl);
  });
  row_parallel_residual(false, v.fch_gelu, 4 * Cl, w.fcproj_w, w.fcproj_b, v.res2, v.out,
                        v.partial);
}

void GptModel::layer_backward_input(int l, const LayerView& v, bool with_weights) {
  const int N = B_ * T_, C = C_, Cl = NHl_ * hs_;
  const auto w = layer_weights(l);
  const auto g = layer_grads(l);
  // MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  // The output gradient is gathered row block by row block beside fcproj's input-gradient
  // GEMM. With the weights, ln2 is gathered again while fc's input gradient is computed,
  // and that summed while the weight gradients are.
  tp_.gather_rows(v.dout, v.dout_gathered, C, [&](int first, int rows, const ops::Act* dout) {
    ops_.linear_backward_input(tp_.row(v.dfch, first, 4 * Cl), dout, w.fcproj_w,
                               tp_.row(v.fch, first, 4 * Cl), rows, 4 * Cl, C);
  });
  ops::Act* dln2 = tp_.partial_target(v.dln2, v.partial);
  auto mlp_input_grad = [&] {
    ops_.gemm(false, true, N, C, 4 * Cl, 1.0f, v.dfch, w.fc_w, 0.0f, dln2);
  };
  const ops::Act* ln2 = nullptr;
  if (with_weights) ln2 = tp_.gather(v.ln2, v.ln2_gathered, C, mlp_input_grad);
  else mlp_input_grad();
  tp_.reduce(dln2, v.dln2, C, [&] {  // column-parallel input gradient
    if (with_weights) mlp_weight_grads(l, v, ln2);
  });
  // The residual's gradient plus the norm's, in one pass (with its weight gradients when
  // W follows B: norm_backward).
  norm_backward(v.dres2, v.dout, v.dln2, v.res2, w.ln2_w, v.ln2_mean, v.ln2_rstd, g.ln2_w, g.ln2_b);
  // Attention: res2 = x + proj(attn(qkv(ln1(x)))); dres2 is gathered as dout was.
  ops::Act* datty = v.dx;  // scratch [N, Cl] (the size of dx's held rows) until dx is written
  tp_.gather_rows(v.dres2, v.dres2_gathered, C, [&](int first, int rows, const ops::Act* dres2) {
    ops_.gemm(false, true, rows, Cl, C, 1.0f, dres2, w.proj_w, 0.0f, tp_.row(datty, first, Cl));
  });
  ops::Act* dln1 = tp_.partial_target(v.dln1, v.partial);
  auto attention_input_grads = [&] {
    attention_backward(v, datty);
    ops_.gemm(false, true, N, C, 3 * Cl, 1.0f, v.dqkv, w.qkv_w, 0.0f, dln1);
  };
  const ops::Act* ln1 = nullptr;
  if (with_weights) ln1 = tp_.gather(v.ln1, v.ln1_gathered, C, attention_input_grads);
  else attention_input_grads();
  tp_.reduce(dln1, v.dln1, C, [&] {  // column-parallel input gradient
    if (with_weights) attention_weight_grads(l, v, ln1);
  });
  norm_backward(v.dx, v.dres2, v.dln1, v.x, w.ln1_w, v.ln1_mean, v.ln1_rstd, g.ln1_w, g.ln1_b);
}

// Where W follows B (every schedule but the zero-bubble ones), a norm's weight gradients
// are computed in B with its input gradient, in one pass over the rows; W skips them.
void GptModel::norm_backward(ops::Act* dinp, const ops::Act* dresidual, const ops::Act* dout,
                             const ops::Act* inp, const ops::Act* w, const float* mean,
                             const float* rstd, float* dw, float* db) {
  const int Nh = tp_.rows_held();
  if (policy().weight_follows_input)
    ops_.layernorm_backward(dinp, dresidual, dout, inp, w, mean, rstd, dw, db, Nh, C_);
  else
    ops_.layernorm_backward_input(dinp, dresidual, dout, inp, w, mean, rstd, Nh, C_);
}

// LayerNorm gradients cover the held rows; under sequence parallelism GradSync sums them
// over tp. The row-parallel biases' gradients come from the gathered output gradients,
// so they are whole on every rank.
// ln1 is gathered while the MLP's weight gradients are computed.
void GptModel::layer_backward_weight(int l, const LayerView& v) {
  const ops::Act* ln2 = tp_.gather(v.ln2, v.ln2_gathered, C_);
  const ops::Act* ln1 =
      tp_.gather(v.ln1, v.ln1_gathered, C_, [&] { mlp_weight_grads(l, v, ln2); });
  attention_weight_grads(l, v, ln1);
  if (!policy().weight_follows_input) norm_weight_grads(l, v);
}

void GptModel::mlp_weight_grads(int l, const LayerView& v, const ops::Act* ln2) {
  const int N = B_ * T_, C = C_, Cl = NHl_ * hs_;
  const auto g = layer_grads(l);
  const ops::Act* dout = tp_.gathered(v.dout, v.dout_gathered);
  ops_.linear_grads(g.fcproj_w, g.fcproj_b, v.fch_gelu, dout, N, 4 * Cl, C);
  ops_.linear_grads(g.fc_w, g.fc_b, ln2, v.dfch, N, C, 4 * Cl);
}

void GptModel::attention_weight_grads(int l, const LayerView& v, const ops::Act* ln1) {
  const int N = B_ * T_, C = C_, Cl = NHl_ * hs_;
  const auto g = layer_grads(l);
  const ops::Act* dres2 = tp_.gathered(v.dres2, v.dres2_gathered);
  ops_.linear_grads(g.proj_w, g.proj_b, v.atty, dres2, N, Cl, C);
  ops_.linear_grads(g.qkv_w, g.qkv_b, ln1, v.dqkv, N, C, 3 * Cl);
}

void GptModel::norm_weight_grads(int l, const LayerView& v) {
  const int Nh = tp_.rows_held(), C = C_;
  const auto g = layer_grads(l);
  ops_.layernorm_backward_weight(g.ln2_w, g.ln2_b, v.dln2, v.res2, v.ln2_mean, v.ln2_rstd, Nh, C);
  ops_.layernorm_backward_weight(g.ln1_w, g.ln1_b, v.dln1, v.x, v.ln1_mean, v.ln1_rstd, Nh, C);
}

}  // namespace pptrain
