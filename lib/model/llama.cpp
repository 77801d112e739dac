// The Llama block's three passes, its final RMSNorm and construction. Norms and residual
// adds run on the rows this rank holds; the products, the rotary embedding and attention
// on all N rows (tp_regions.hpp).
#include "model/llama.hpp"

#include "core/error.hpp"

namespace pptrain {

namespace {
// The first tensor of each packed run, in LayerTensors order.
const std::vector<std::string> kLayerTensorNames = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.o_proj.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.down_proj.weight"};
}  // namespace

LlamaModel::LlamaModel(const ModelConfig& model, int batch, ops::Ops& ops,
                       const ModelPartition& part, comm::Group* tp,
                       const ActivationPolicy& policy, Master master, const ContextRing& ring)
    : DecoderModel(model, batch, ops, part, tp, policy, master, ring),
      W_((NHl_ + 2 * NKVl_) * hs_),
      Fl_(ffn_width(model) / part.tp_size),
      eps_(float(model.norm_eps)),
      embedding_(pptrain::embedding_name(Arch::Llama)),
      head_(model.tie_embeddings ? embedding_ : std::string("lm_head.weight")),
      layer_offsets_(layer_offsets(kLayerTensorNames)) {
  PPTRAIN_CHECK(model.arch == Arch::Llama && hs_ % 2 == 0, "not a llama shape");
  init_activation_layouts();
}

template <typename P>
LlamaModel::LayerTensors<P> LlamaModel::layer_tensors(int layer, P arena) const {
  const size_t* o = &layer_offsets_[size_t(layer) * kLayerTensorNames.size()];
  PPTRAIN_CHECK(o[0] != SIZE_MAX, "layer not held by this rank");
  auto at = [&](int k) -> P {
    if constexpr (std::is_same_v<P, float*>) return arena + o[k];
    else return ops::advance(arena, o[k], dt_);
  };
  return {at(0), at(1), at(2), at(3), at(4), at(5)};
}

// Each piece of the held sequences (one piece of whole sequences without context
// parallelism) is B runs of piece_len() rows from its first position.
void LlamaModel::rope(ops::Act* qkv, bool inverse) {
  const int len = split_.piece_len();
  for (int p = 0; p < split_.pieces(); ++p)
    ops_.rope(ops::advance(qkv, std::size_t(p) * B_ * len * W_, dt_), B_ * len, len, W_,
              NHl_ + NKVl_, hs_, float(cfg_.rope_theta), inverse, split_.first(p));
}

void LlamaModel::final_norm_forward(ops::Act* out, float* /*mean*/, float* rstd,
                                    const ops::Act* inp, int rows) {
  ops_.rmsnorm_forward(out, rstd, inp, weight(norm_), rows, C_, eps_);
}

void LlamaModel::final_norm_backward_input(ops::Act* dinp, const ops::Act* dout,
                                           const ops::Act* inp, const float* /*mean*/,
                                           const float* rstd, int rows) {
  ops_.rmsnorm_backward_input(dinp, dinp, dout, inp, weight(norm_), rstd, rows, C_);
}

void LlamaModel::final_norm_backward_weight(const ops::Act* dout, const ops::Act* inp,
                                            const float* /*mean*/, const float* rstd, int rows) {
  ops_.rmsnorm_backward_weight(grad(norm_), dout, inp, rstd, rows, C_);
}

void LlamaModel::layer_forward(int l, const LayerView& v) {
  const int N = B_ * T_, Nh = tp_.rows_held(), C = C_, Cl = NHl_ * hs_;
  const auto w = layer_tensors<const ops::Act*>(l, weights());
  // Attention: res2 = x + o_proj(attn(rope(q, k), v)), q|k|v = ln1 @ qkv^T.
  ops_.rmsnorm_forward(v.ln1, v.ln1_rstd, v.x, w.ln1, Nh, C, eps_);
  // Each tp collective travels row block by row block beside its GEMM's other blocks
  // (gather_rows, reduce_rows).
  tp_.gather_rows(v.ln1, v.ln1_gathered, C, [&](int first, int rows, const ops::Act* ln1) {
    ops_.gemm(false, true, rows, W_, C, 1.0f, ln1, w.qkv, 0.0f, tp_.row(v.qkv, first, W_));
  });
  rope(v.qkv, false);
  attention_forward(v);
  row_parallel_residual(true, v.atty, Cl, w.o, nullptr, v.x, v.res2, v.partial);
  // MLP: out = res2 + down_proj(silu(gate) * up), gate|up = ln2 @ gate_up^T.
  ops_.rmsnorm_forward(v.ln2, v.ln2_rstd, v.res2, w.ln2, Nh, C, eps_);
  tp_.gather_rows(v.ln2, v.ln2_gathered, C, [&](int first, int rows, const ops::Act* ln2) {
    ops_.gemm(false, true, rows, 2 * Fl_, C, 1.0f, ln2, w.gate_up, 0.0f,
              tp_.row(v.fch, first, 2 * Fl_));
  });
  ops_.swiglu_forward(v.fch_gelu, v.fch, N, Fl_);
  row_parallel_residual(true, v.fch_gelu, Fl_, w.down, nullptr, v.res2, v.out, v.partial);
}

void LlamaModel::layer_backward_input(int l, const LayerView& v, bool with_weights) {
  const int N = B_ * T_, C = C_, Cl = NHl_ * hs_;
  const auto w = layer_tensors<const ops::Act*>(l, weights());
  // MLP.
  // The output gradient is gathered row block by row block beside down_proj's
  // input-gradient GEMM. With the weights, ln2 is gathered again while the rest of the
  // input gradient is computed, and that summed while the weight gradients are.
  tp_.gather_rows(v.dout, v.dout_gathered, C, [&](int first, int rows, const ops::Act* dout) {
    ops_.gemm(false, false, rows, Fl_, C, 1.0f, dout, w.down, 0.0f,
              tp_.row(v.dfch_act, first, Fl_));
  });
  ops::Act* dln2 = tp_.partial_target(v.dln2, v.partial);
  auto mlp_input_grads = [&] {
    ops_.swiglu_backward(v.dfch, v.dfch_act, v.fch, N, Fl_);
    ops_.gemm(false, false, N, C, 2 * Fl_, 1.0f, v.dfch, w.gate_up, 0.0f, dln2);
  };
  const ops::Act* ln2 = nullptr;
  if (with_weights) ln2 = tp_.gather(v.ln2, v.ln2_gathered, C, mlp_input_grads);
  else mlp_input_grads();
  tp_.reduce(dln2, v.dln2, C, [&] {  // column-parallel input gradient
    if (with_weights) mlp_weight_grads(l, v, ln2);
  });
  // The residual's gradient plus the norm's, in one pass (with the norm's weight gradient
  // where W follows B: norm_backward).
  const auto g = layer_tensors<float*>(l, grads());
  norm_backward(v.dres2, v.dout, v.dln2, v.res2, w.ln2, v.ln2_rstd, g.ln2);
  // Attention; q and k are rotated back after the attention's backward. dres2 is
  // gathered as dout was.
  ops::Act* datty = v.dx;  // scratch [N, Cl] (the size of dx's held rows) until dx is written
  tp_.gather_rows(v.dres2, v.dres2_gathered, C, [&](int first, int rows, const ops::Act* dres2) {
    ops_.gemm(false, false, rows, Cl, C, 1.0f, dres2, w.o, 0.0f, tp_.row(datty, first, Cl));
  });
  ops::Act* dln1 = tp_.partial_target(v.dln1, v.partial);
  auto attention_input_grads = [&] {
    attention_backward(v, datty);
    rope(v.dqkv, true);
    ops_.gemm(false, false, N, C, W_, 1.0f, v.dqkv, w.qkv, 0.0f, dln1);
  };
  const ops::Act* ln1 = nullptr;
  if (with_weights) ln1 = tp_.gather(v.ln1, v.ln1_gathered, C, attention_input_grads);
  else attention_input_grads();
  tp_.reduce(dln1, v.dln1, C, [&] {  // column-parallel input gradient
    if (with_weights) attention_weight_grads(l, v, ln1);
  });
  norm_backward(v.dx, v.dres2, v.dln1, v.x, w.ln1, v.ln1_rstd, g.ln1);
}

// Where W follows B (every schedule but the zero-bubble ones), a norm's weight gradient is
// computed in B with its input gradient, in one pass over the rows; W skips it.
void LlamaModel::norm_backward(ops::Act* dinp, const ops::Act* dresidual, const ops::Act* dout,
                               const ops::Act* inp, const ops::Act* w, const float* rstd,
                               float* dw) {
  const int Nh = tp_.rows_held();
  if (policy().weight_follows_input)
    ops_.rmsnorm_backward(dinp, dresidual, dout, inp, w, rstd, dw, Nh, C_);
  else
    ops_.rmsnorm_backward_input(dinp, dresidual, dout, inp, w, rstd, Nh, C_);
}

// The RMSNorm gradients cover the held rows; under sequence parallelism GradSync sums
// them over tp. Weight gradients of (out, in) weights: dW += dout^T @ inp.
// ln1 is gathered while the MLP's weight gradients are computed.
void LlamaModel::layer_backward_weight(int l, const LayerView& v) {
  const ops::Act* ln2 = tp_.gather(v.ln2, v.ln2_gathered, C_);
  const ops::Act* ln1 =
      tp_.gather(v.ln1, v.ln1_gathered, C_, [&] { mlp_weight_grads(l, v, ln2); });
  attention_weight_grads(l, v, ln1);
  if (!policy().weight_follows_input) norm_weight_grads(l, v);
}

void LlamaModel::mlp_weight_grads(int l, const LayerView& v, const ops::Act* ln2) {
  const int N = B_ * T_, C = C_;
  const auto g = layer_tensors<float*>(l, grads());
  const ops::Act* dout = tp_.gathered(v.dout, v.dout_gathered);
  ops_.linear_weight_grad(g.down, dout, v.fch_gelu, N, C, Fl_);
  ops_.linear_weight_grad(g.gate_up, v.dfch, ln2, N, 2 * Fl_, C);
}

void LlamaModel::attention_weight_grads(int l, const LayerView& v, const ops::Act* ln1) {
  const int N = B_ * T_, C = C_, Cl = NHl_ * hs_;
  const auto g = layer_tensors<float*>(l, grads());
  const ops::Act* dres2 = tp_.gathered(v.dres2, v.dres2_gathered);
  ops_.linear_weight_grad(g.o, dres2, v.atty, N, C, Cl);
  ops_.linear_weight_grad(g.qkv, v.dqkv, ln1, N, W_, C);
}

void LlamaModel::norm_weight_grads(int l, const LayerView& v) {
  const int Nh = tp_.rows_held(), C = C_;
  const auto g = layer_tensors<float*>(l, grads());
  ops_.rmsnorm_backward_weight(g.ln2, v.dln2, v.res2, v.ln2_rstd, Nh, C);
  ops_.rmsnorm_backward_weight(g.ln1, v.dln1, v.x, v.ln1_rstd, Nh, C);
}

}  // namespace pptrain
