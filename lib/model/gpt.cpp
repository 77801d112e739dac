// GPT-2 forward and split backward on one rank, written against ops::Ops.
#include "model/gpt.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"

namespace pptrain {

namespace {
constexpr int kTensorsPerLayer = 12;
constexpr int kFirstLayerEntry = 2;  // after wte and wpe
}  // namespace

GptModel::GptModel(const ModelConfig& model, int batch, ops::Ops& ops)
    : cfg_(model),
      B_(batch),
      T_(model.seq_len),
      C_(model.d_model),
      NH_(model.n_head),
      Vp_(padded_vocab(model)),
      ops_(ops),
      layout_(gpt_param_layout(model)),
      params_(layout_.total_floats()),
      grads_(layout_.total_floats()),
      inputs_(size_t(batch) * model.seq_len),
      targets_(size_t(batch) * model.seq_len) {
  PPTRAIN_CHECK(batch >= 1 && C_ % NH_ == 0, "bad model shape");
  const size_t N = size_t(B_) * T_, C = C_;
  for (int l = 0; l <= cfg_.n_layer; ++l) {
    x_.emplace_back(N * C);
    dx_.emplace_back(N * C);
  }
  layers_.resize(cfg_.n_layer);
  for (auto& a : layers_) {
    a.ln1 = AlignedBuffer<float>(N * C);
    a.ln1_mean = AlignedBuffer<float>(N);
    a.ln1_rstd = AlignedBuffer<float>(N);
    a.qkv = AlignedBuffer<float>(N * 3 * C);
    a.att = AlignedBuffer<float>(size_t(B_) * NH_ * T_ * T_);
    a.atty = AlignedBuffer<float>(N * C);
    a.res2 = AlignedBuffer<float>(N * C);
    a.ln2 = AlignedBuffer<float>(N * C);
    a.ln2_mean = AlignedBuffer<float>(N);
    a.ln2_rstd = AlignedBuffer<float>(N);
    a.fch = AlignedBuffer<float>(N * 4 * C);
    a.fch_gelu = AlignedBuffer<float>(N * 4 * C);
    a.dres2 = AlignedBuffer<float>(N * C);
    a.dfch = AlignedBuffer<float>(N * 4 * C);
    a.dln2 = AlignedBuffer<float>(N * C);
    a.dqkv = AlignedBuffer<float>(N * 3 * C);
    a.dln1 = AlignedBuffer<float>(N * C);
  }
  lnf_ = AlignedBuffer<float>(N * C);
  lnf_mean_ = AlignedBuffer<float>(N);
  lnf_rstd_ = AlignedBuffer<float>(N);
  logits_ = AlignedBuffer<float>(N * Vp_);  // holds dlogits after backward_input
  losses_ = AlignedBuffer<float>(N);
  dlnf_ = AlignedBuffer<float>(N * C);
}

int64_t gpt_activation_floats(const ModelConfig& m, int batch) {
  const int64_t N = int64_t(batch) * m.seq_len, C = m.d_model, L = m.n_layer;
  const int64_t per_layer = 3 * N + 3 * N + N * 3 * C + int64_t(batch) * m.n_head * m.seq_len *
                                m.seq_len + 4 * N * C + 8 * N * C    // forward values
                            + 3 * N * C + 4 * N * C + 3 * N * C;      // saved gradients
  return L * per_layer + 2 * (L + 1) * N * C + 2 * N * C + 2 * N + N * padded_vocab(m) + N;
}

double gpt_flops_per_token(const ModelConfig& m) {
  const double L = m.n_layer, C = m.d_model, T = m.seq_len, Vp = padded_vocab(m);
  return 72.0 * L * C * C + 6.0 * C * Vp + 12.0 * L * T * C;
}

float* GptModel::tensor(float* arena, const char* name) const {
  return arena + layout_.at(name).offset;
}

GptModel::LayerTensors GptModel::layer_tensors(float* arena, int l) const {
  const auto& e = layout_.entries();
  auto p = [&](int k) { return arena + e[kFirstLayerEntry + kTensorsPerLayer * l + k].offset; };
  return {p(0), p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), p(10), p(11)};
}

void GptModel::zero_grads() { grads_.zero(); }

float GptModel::forward(const int32_t* inputs, const int32_t* targets, float loss_scale) {
  const int N = B_ * T_;
  std::memcpy(inputs_.data(), inputs, sizeof(int32_t) * N);
  std::memcpy(targets_.data(), targets, sizeof(int32_t) * N);
  float* P = params_.data();
  float* wte = tensor(P, "transformer.wte.weight");
  ops_.embedding_forward(x_[0].data(), inputs_.data(), wte, tensor(P, "transformer.wpe.weight"),
                         B_, T_, C_);
  for (int l = 0; l < cfg_.n_layer; ++l) layer_forward(l);
  ops_.layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(),
                         x_[cfg_.n_layer].data(), tensor(P, "transformer.ln_f.weight"),
                         tensor(P, "transformer.ln_f.bias"), N, C_);
  // Tied LM head: logits[N,Vp] = lnf[N,C] @ wte[Vp,C]^T.
  ops_.gemm(false, true, N, Vp_, C_, 1.0f, lnf_.data(), wte, 0.0f, logits_.data());
  // With a loss scale the fused cross-entropy also turns the logits into dlogits.
  ops_.cross_entropy(losses_.data(), loss_scale > 0 ? logits_.data() : nullptr, logits_.data(),
                     targets_.data(), N, cfg_.vocab_size, Vp_, loss_scale / float(N));
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += losses_[i];
  return float(sum / N);
}

void GptModel::layer_forward(int l) {
  const int N = B_ * T_, C = C_;
  LayerTensors w = layer_tensors(params_.data(), l);
  LayerActs& a = layers_[l];
  const float* x = x_[l].data();
  float* out = x_[l + 1].data();
  ops_.layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, w.ln1_w, w.ln1_b,
                         N, C);
  ops_.gemm(false, false, N, 3 * C, C, 1.0f, a.ln1.data(), w.qkv_w, 0.0f, a.qkv.data());
  ops_.add_bias(a.qkv.data(), w.qkv_b, N, 3 * C);
  ops_.attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B_, T_, C, NH_);
  ops_.gemm(false, false, N, C, C, 1.0f, a.atty.data(), w.proj_w, 0.0f, a.res2.data());
  ops_.add_bias(a.res2.data(), w.proj_b, N, C);
  ops_.add(a.res2.data(), a.res2.data(), x, size_t(N) * C);
  ops_.layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(),
                         w.ln2_w, w.ln2_b, N, C);
  ops_.gemm(false, false, N, 4 * C, C, 1.0f, a.ln2.data(), w.fc_w, 0.0f, a.fch.data());
  ops_.add_bias(a.fch.data(), w.fc_b, N, 4 * C);
  ops_.gelu_forward(a.fch_gelu.data(), a.fch.data(), size_t(N) * 4 * C);
  ops_.gemm(false, false, N, C, 4 * C, 1.0f, a.fch_gelu.data(), w.fcproj_w, 0.0f, out);
  ops_.add_bias(out, w.fcproj_b, N, C);
  ops_.add(out, out, a.res2.data(), size_t(N) * C);
}

void GptModel::backward_input() {
  const int N = B_ * T_, L = cfg_.n_layer;
  float* P = params_.data();
  float* wte = tensor(P, "transformer.wte.weight");
  ops_.gemm(false, false, N, C_, Vp_, 1.0f, logits_.data(), wte, 0.0f, dlnf_.data());
  dx_[L].zero();
  ops_.layernorm_backward_input(dx_[L].data(), dlnf_.data(), x_[L].data(),
                                tensor(P, "transformer.ln_f.weight"), lnf_mean_.data(),
                                lnf_rstd_.data(), N, C_);
  for (int l = L - 1; l >= 0; --l) layer_backward_input(l);
}

void GptModel::layer_backward_input(int l) {
  const int N = B_ * T_, C = C_;
  const size_t NC = size_t(N) * C;
  LayerTensors w = layer_tensors(params_.data(), l);
  LayerActs& a = layers_[l];
  const float* dout = dx_[l + 1].data();
  // MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  ops_.gemm(false, true, N, 4 * C, C, 1.0f, dout, w.fcproj_w, 0.0f, a.dfch.data());
  ops_.gelu_backward(a.dfch.data(), a.fch.data(), a.dfch.data(), size_t(N) * 4 * C);
  ops_.gemm(false, true, N, C, 4 * C, 1.0f, a.dfch.data(), w.fc_w, 0.0f, a.dln2.data());
  std::memcpy(a.dres2.data(), dout, NC * sizeof(float));
  ops_.layernorm_backward_input(a.dres2.data(), a.dln2.data(), a.res2.data(), w.ln2_w,
                                a.ln2_mean.data(), a.ln2_rstd.data(), N, C);
  // Attention: res2 = x + proj(attn(qkv(ln1(x)))).
  float* datty = dx_[l].data();  // scratch until dx_[l] is written below
  ops_.gemm(false, true, N, C, C, 1.0f, a.dres2.data(), w.proj_w, 0.0f, datty);
  ops_.attention_backward(a.dqkv.data(), datty, a.qkv.data(), a.att.data(), B_, T_, C, NH_);
  ops_.gemm(false, true, N, C, 3 * C, 1.0f, a.dqkv.data(), w.qkv_w, 0.0f, a.dln1.data());
  std::memcpy(dx_[l].data(), a.dres2.data(), NC * sizeof(float));
  ops_.layernorm_backward_input(dx_[l].data(), a.dln1.data(), x_[l].data(), w.ln1_w,
                                a.ln1_mean.data(), a.ln1_rstd.data(), N, C);
}

void GptModel::backward_weight() {
  const int N = B_ * T_, L = cfg_.n_layer;
  float* G = grads_.data();
  for (int l = L - 1; l >= 0; --l) layer_backward_weight(l);
  // Tied head: dwte += dlogits^T @ lnf; final LayerNorm; embeddings.
  float* dwte = tensor(G, "transformer.wte.weight");
  ops_.gemm(true, false, Vp_, C_, N, 1.0f, logits_.data(), lnf_.data(), 1.0f, dwte);
  ops_.layernorm_backward_weight(tensor(G, "transformer.ln_f.weight"),
                                 tensor(G, "transformer.ln_f.bias"), dlnf_.data(), x_[L].data(),
                                 lnf_mean_.data(), lnf_rstd_.data(), N, C_);
  ops_.embedding_backward(dwte, tensor(G, "transformer.wpe.weight"), dx_[0].data(),
                          inputs_.data(), B_, T_, C_);
}

void GptModel::layer_backward_weight(int l) {
  const int N = B_ * T_, C = C_;
  LayerTensors g = layer_tensors(grads_.data(), l);
  LayerActs& a = layers_[l];
  const float* dout = dx_[l + 1].data();
  ops_.gemm(true, false, 4 * C, C, N, 1.0f, a.fch_gelu.data(), dout, 1.0f, g.fcproj_w);
  ops_.bias_backward(g.fcproj_b, dout, N, C);
  ops_.gemm(true, false, C, 4 * C, N, 1.0f, a.ln2.data(), a.dfch.data(), 1.0f, g.fc_w);
  ops_.bias_backward(g.fc_b, a.dfch.data(), N, 4 * C);
  ops_.layernorm_backward_weight(g.ln2_w, g.ln2_b, a.dln2.data(), a.res2.data(),
                                 a.ln2_mean.data(), a.ln2_rstd.data(), N, C);
  ops_.gemm(true, false, C, C, N, 1.0f, a.atty.data(), a.dres2.data(), 1.0f, g.proj_w);
  ops_.bias_backward(g.proj_b, a.dres2.data(), N, C);
  ops_.gemm(true, false, C, 3 * C, N, 1.0f, a.ln1.data(), a.dqkv.data(), 1.0f, g.qkv_w);
  ops_.bias_backward(g.qkv_b, a.dqkv.data(), N, 3 * C);
  ops_.layernorm_backward_weight(g.ln1_w, g.ln1_b, a.dln1.data(), x_[l].data(),
                                 a.ln1_mean.data(), a.ln1_rstd.data(), N, C);
}

}  // namespace pptrain
