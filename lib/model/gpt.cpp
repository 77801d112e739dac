// GPT-2 forward and split backward for the chunks and tensor-parallel shard a rank
// holds, written against ops::Ops; the tp all-reduces follow Megatron's f/g pairs.
#include "model/gpt.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.hpp"

namespace pptrain {

namespace {
constexpr int kTensorsPerLayer = 12;
const char* const kLayerTensorNames[kTensorsPerLayer] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
}  // namespace

GptModel::GptModel(const ModelConfig& model, int batch, ops::Ops& ops,
                   const ModelPartition& part, comm::Group* tp)
    : cfg_(model),
      part_(part),
      B_(batch),
      T_(model.seq_len),
      C_(model.d_model),
      Cl_(model.d_model / part.tp_size),
      NH_(model.n_head),
      NHl_(model.n_head / part.tp_size),
      Vrows_(vocab_rows_per_shard(model, part.tp_size)),
      vocab_begin_(part.tp_rank * vocab_rows_per_shard(model, part.tp_size)),
      ops_(ops),
      tp_(tp),
      layout_(gpt_param_layout(model, part)),
      params_(layout_.total_floats()),
      grads_(layout_.total_floats()),
      layer_offsets_(size_t(model.n_layer) * kTensorsPerLayer, SIZE_MAX) {
  PPTRAIN_CHECK(batch >= 1 && C_ % NH_ == 0 && NH_ % part.tp_size == 0, "bad model shape");
  PPTRAIN_CHECK(part.tp_size == 1 || (tp && tp->size() == part.tp_size), "tp group mismatch");
  PPTRAIN_CHECK(!part_.chunks.empty(), "no chunks");
  for (const ChunkSpec& c : part_.chunks)
    for (int l = c.layer_begin; l < c.layer_end; ++l)
      for (int k = 0; k < kTensorsPerLayer; ++k)
        layer_offsets_[size_t(l) * kTensorsPerLayer + k] =
            layout_.at("transformer.h." + std::to_string(l) + "." + kLayerTensorNames[k]).offset;
  if (part_.chunks.size() == 1) whole_ = new_activations(0);
}

GptModel::~GptModel() = default;

std::unique_ptr<GptModel::Activations> GptModel::new_activations(int chunk) const {
  const ChunkSpec& c = part_.chunks.at(size_t(chunk));
  const size_t N = size_t(B_) * T_, C = C_, Cl = Cl_;
  auto a = std::make_unique<Activations>();
  a->tokens.resize(N);
  a->targets.resize(N);
  const int n = c.layer_end - c.layer_begin;
  for (int i = 0; i <= n; ++i) {
    a->x.emplace_back(N * C);
    a->dx.emplace_back(N * C);
  }
  a->layers.resize(size_t(n));
  for (auto& L : a->layers) {
    L.ln1 = AlignedBuffer<float>(N * C);
    L.ln1_mean = AlignedBuffer<float>(N);
    L.ln1_rstd = AlignedBuffer<float>(N);
    L.qkv = AlignedBuffer<float>(N * 3 * Cl);
    L.att = AlignedBuffer<float>(size_t(B_) * NHl_ * T_ * T_);
    L.atty = AlignedBuffer<float>(N * Cl);
    L.res2 = AlignedBuffer<float>(N * C);
    L.ln2 = AlignedBuffer<float>(N * C);
    L.ln2_mean = AlignedBuffer<float>(N);
    L.ln2_rstd = AlignedBuffer<float>(N);
    L.fch = AlignedBuffer<float>(N * 4 * Cl);
    L.fch_gelu = AlignedBuffer<float>(N * 4 * Cl);
    L.dres2 = AlignedBuffer<float>(N * C);
    L.dfch = AlignedBuffer<float>(N * 4 * Cl);
    L.dln2 = AlignedBuffer<float>(N * C);
    L.dqkv = AlignedBuffer<float>(N * 3 * Cl);
    L.dln1 = AlignedBuffer<float>(N * C);
  }
  if (c.last) {
    a->lnf = AlignedBuffer<float>(N * C);
    a->lnf_mean = AlignedBuffer<float>(N);
    a->lnf_rstd = AlignedBuffer<float>(N);
    a->logits = AlignedBuffer<float>(N * size_t(Vrows_));  // dlogits after a training forward
    a->losses = AlignedBuffer<float>(N);
    a->dlnf = AlignedBuffer<float>(N * C);
    a->ce_max = AlignedBuffer<float>(N);
    a->ce_stats = AlignedBuffer<float>(2 * N);
  }
  return a;
}

int64_t gpt_activation_floats(const ModelConfig& m, int batch) {
  const int64_t N = int64_t(batch) * m.seq_len, C = m.d_model, L = m.n_layer;
  const int64_t per_layer = 3 * N + 3 * N + N * 3 * C + int64_t(batch) * m.n_head * m.seq_len *
                                m.seq_len + 4 * N * C + 8 * N * C    // forward values
                            + 3 * N * C + 4 * N * C + 3 * N * C;      // saved gradients
  return L * per_layer + 2 * (L + 1) * N * C + 2 * N * C + 5 * N + N * padded_vocab(m) + N;
}

double gpt_flops_per_token(const ModelConfig& m) {
  const double L = m.n_layer, C = m.d_model, T = m.seq_len, Vp = padded_vocab(m);
  return 72.0 * L * C * C + 6.0 * C * Vp + 12.0 * L * T * C;
}

float* GptModel::tensor(float* arena, const char* name) const {
  return arena + layout_.at(name).offset;
}

GptModel::LayerTensors GptModel::layer_tensors(float* arena, int layer) const {
  const size_t* o = &layer_offsets_[size_t(layer) * kTensorsPerLayer];
  PPTRAIN_CHECK(o[0] != SIZE_MAX, "layer not held by this rank");
  return {arena + o[0], arena + o[1], arena + o[2], arena + o[3], arena + o[4],  arena + o[5],
          arena + o[6], arena + o[7], arena + o[8], arena + o[9], arena + o[10], arena + o[11]};
}

void GptModel::all_reduce_tp(float* data, std::size_t n) {
  if (part_.tp_size > 1) tp_->all_reduce(data, n, comm::ReduceOp::Sum);
}

void GptModel::zero_grads() { grads_.zero(); }

float* GptModel::input_buffer(Activations& a) const { return a.x.front().data(); }
const float* GptModel::output(const Activations& a) const { return a.x.back().data(); }
float* GptModel::output_grad(Activations& a) const { return a.dx.back().data(); }
const float* GptModel::input_grad(const Activations& a) const { return a.dx.front().data(); }
const float* GptModel::position_losses(const Activations& a) const { return a.losses.data(); }
const float* GptModel::position_losses() const { return whole_->losses.data(); }

float GptModel::forward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  return forward(0, *whole_, tokens, nullptr, targets, loss_scale);
}
void GptModel::backward_input() { backward_input(0, *whole_); }
void GptModel::backward_weight() { backward_weight(0, *whole_); }

float GptModel::forward(int chunk, Activations& a, const int32_t* tokens, const float* input,
                        const int32_t* targets, float loss_scale) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const size_t N = size_t(B_) * T_;
  if (c.first) {
    std::memcpy(a.tokens.data(), tokens, sizeof(int32_t) * N);
    embed(a);
  } else if (input != a.x[0].data()) {
    std::memcpy(a.x[0].data(), input, sizeof(float) * N * C_);
  }
  for (int l = c.layer_begin; l < c.layer_end; ++l) layer_forward(l, a, l - c.layer_begin);
  if (!c.last) return 0.0f;
  std::memcpy(a.targets.data(), targets, sizeof(int32_t) * N);
  return head_forward(a, loss_scale);
}

void GptModel::embed(Activations& a) {
  float* P = params_.data();
  float* x0 = a.x[0].data();
  const float* wpe = tensor(P, "transformer.wpe.weight");
  if (part_.tp_size == 1) {
    ops_.embedding_forward(x0, a.tokens.data(), tensor(P, "transformer.wte.weight"), 0, Vrows_,
                           wpe, B_, T_, C_);
    return;
  }
  // Vocab-parallel: each shard looks up its own rows, the sum assembles the embedding.
  ops_.embedding_forward(x0, a.tokens.data(), tensor(P, "transformer.wte.weight"), vocab_begin_,
                         Vrows_, nullptr, B_, T_, C_);
  all_reduce_tp(x0, size_t(B_) * T_ * C_);
  for (int b = 0; b < B_; ++b) {
    float* row = x0 + size_t(b) * T_ * C_;
    ops_.add(row, row, wpe, size_t(T_) * C_);
  }
}

float GptModel::head_forward(Activations& a, float loss_scale) {
  const int N = B_ * T_, V = cfg_.vocab_size;
  float* P = params_.data();
  ops_.layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), a.x.back().data(),
                         tensor(P, "transformer.ln_f.weight"), tensor(P, "transformer.ln_f.bias"),
                         N, C_);
  // Tied head: logits[N, Vrows] = lnf[N,C] @ wte_shard[Vrows,C]^T.
  ops_.gemm(false, true, N, Vrows_, C_, 1.0f, a.lnf.data(), tensor(P, "transformer.wte.weight"),
            0.0f, a.logits.data());
  // With a loss scale the cross-entropy also turns the logits into dlogits in place.
  float* dlogits = loss_scale > 0 ? a.logits.data() : nullptr;
  const float dloss = loss_scale / float(N);
  if (part_.tp_size == 1) {
    ops_.cross_entropy(a.losses.data(), dlogits, a.logits.data(), a.targets.data(), N, V, Vrows_,
                       dloss);
  } else {  // vocab-parallel: full logits are never gathered
    ops_.ce_row_max(a.ce_max.data(), a.logits.data(), N, Vrows_, vocab_begin_, V);
    tp_->all_reduce(a.ce_max.data(), size_t(N), comm::ReduceOp::Max);
    ops_.ce_partial_sums(a.ce_stats.data(), a.logits.data(), a.ce_max.data(), a.targets.data(), N,
                         Vrows_, vocab_begin_, V);
    tp_->all_reduce(a.ce_stats.data(), 2 * size_t(N), comm::ReduceOp::Sum);
    ops_.ce_finish(a.losses.data(), dlogits, a.logits.data(), a.ce_max.data(), a.ce_stats.data(),
                   a.targets.data(), N, Vrows_, vocab_begin_, V, dloss);
  }
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += a.losses[size_t(i)];
  return float(sum / N);
}

void GptModel::layer_forward(int l, Activations& a, int i) {
  const int N = B_ * T_, C = C_, Cl = Cl_;
  LayerTensors w = layer_tensors(params_.data(), l);
  Activations::Layer& L = a.layers[size_t(i)];
  const float* x = a.x[size_t(i)].data();
  float* out = a.x[size_t(i) + 1].data();
  ops_.layernorm_forward(L.ln1.data(), L.ln1_mean.data(), L.ln1_rstd.data(), x, w.ln1_w, w.ln1_b,
                         N, C);
  ops_.gemm(false, false, N, 3 * Cl, C, 1.0f, L.ln1.data(), w.qkv_w, 0.0f, L.qkv.data());
  ops_.add_bias(L.qkv.data(), w.qkv_b, N, 3 * Cl);
  ops_.attention_forward(L.atty.data(), L.att.data(), L.qkv.data(), B_, T_, Cl, NHl_);
  ops_.gemm(false, false, N, C, Cl, 1.0f, L.atty.data(), w.proj_w, 0.0f, L.res2.data());
  all_reduce_tp(L.res2.data(), size_t(N) * C);  // row-parallel output
  ops_.add_bias(L.res2.data(), w.proj_b, N, C);
  ops_.add(L.res2.data(), L.res2.data(), x, size_t(N) * C);
  ops_.layernorm_forward(L.ln2.data(), L.ln2_mean.data(), L.ln2_rstd.data(), L.res2.data(),
                         w.ln2_w, w.ln2_b, N, C);
  ops_.gemm(false, false, N, 4 * Cl, C, 1.0f, L.ln2.data(), w.fc_w, 0.0f, L.fch.data());
  ops_.add_bias(L.fch.data(), w.fc_b, N, 4 * Cl);
  ops_.gelu_forward(L.fch_gelu.data(), L.fch.data(), size_t(N) * 4 * Cl);
  ops_.gemm(false, false, N, C, 4 * Cl, 1.0f, L.fch_gelu.data(), w.fcproj_w, 0.0f, out);
  all_reduce_tp(out, size_t(N) * C);  // row-parallel output
  ops_.add_bias(out, w.fcproj_b, N, C);
  ops_.add(out, out, L.res2.data(), size_t(N) * C);
}

void GptModel::backward_input(int chunk, Activations& a) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  if (c.last) head_backward_input(a);
  for (int l = c.layer_end - 1; l >= c.layer_begin; --l)
    layer_backward_input(l, a, l - c.layer_begin);
}

void GptModel::head_backward_input(Activations& a) {
  const int N = B_ * T_;
  float* P = params_.data();
  ops_.gemm(false, false, N, C_, Vrows_, 1.0f, a.logits.data(),
            tensor(P, "transformer.wte.weight"), 0.0f, a.dlnf.data());
  all_reduce_tp(a.dlnf.data(), size_t(N) * C_);  // the vocab shards' contributions
  a.dx.back().zero();
  ops_.layernorm_backward_input(a.dx.back().data(), a.dlnf.data(), a.x.back().data(),
                                tensor(P, "transformer.ln_f.weight"), a.lnf_mean.data(),
                                a.lnf_rstd.data(), N, C_);
}

void GptModel::layer_backward_input(int l, Activations& a, int i) {
  const int N = B_ * T_, C = C_, Cl = Cl_;
  const size_t NC = size_t(N) * C;
  LayerTensors w = layer_tensors(params_.data(), l);
  Activations::Layer& L = a.layers[size_t(i)];
  const float* dout = a.dx[size_t(i) + 1].data();
  // MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  ops_.gemm(false, true, N, 4 * Cl, C, 1.0f, dout, w.fcproj_w, 0.0f, L.dfch.data());
  ops_.gelu_backward(L.dfch.data(), L.fch.data(), L.dfch.data(), size_t(N) * 4 * Cl);
  ops_.gemm(false, true, N, C, 4 * Cl, 1.0f, L.dfch.data(), w.fc_w, 0.0f, L.dln2.data());
  all_reduce_tp(L.dln2.data(), NC);  // column-parallel input gradient
  std::memcpy(L.dres2.data(), dout, NC * sizeof(float));
  ops_.layernorm_backward_input(L.dres2.data(), L.dln2.data(), L.res2.data(), w.ln2_w,
                                L.ln2_mean.data(), L.ln2_rstd.data(), N, C);
  // Attention: res2 = x + proj(attn(qkv(ln1(x)))).
  float* dx = a.dx[size_t(i)].data();
  float* datty = dx;  // scratch [N, Cl] until dx is written below
  ops_.gemm(false, true, N, Cl, C, 1.0f, L.dres2.data(), w.proj_w, 0.0f, datty);
  ops_.attention_backward(L.dqkv.data(), datty, L.qkv.data(), L.att.data(), B_, T_, Cl, NHl_);
  ops_.gemm(false, true, N, C, 3 * Cl, 1.0f, L.dqkv.data(), w.qkv_w, 0.0f, L.dln1.data());
  all_reduce_tp(L.dln1.data(), NC);  // column-parallel input gradient
  std::memcpy(dx, L.dres2.data(), NC * sizeof(float));
  ops_.layernorm_backward_input(dx, L.dln1.data(), a.x[size_t(i)].data(), w.ln1_w,
                                L.ln1_mean.data(), L.ln1_rstd.data(), N, C);
}

void GptModel::backward_weight(int chunk, Activations& a) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const int N = B_ * T_;
  float* G = grads_.data();
  for (int l = c.layer_end - 1; l >= c.layer_begin; --l)
    layer_backward_weight(l, a, l - c.layer_begin);
  float* dwte = c.first || c.last ? tensor(G, "transformer.wte.weight") : nullptr;
  if (c.last) {  // tied head: dwte += dlogits^T @ lnf; final LayerNorm
    ops_.gemm(true, false, Vrows_, C_, N, 1.0f, a.logits.data(), a.lnf.data(), 1.0f, dwte);
    ops_.layernorm_backward_weight(tensor(G, "transformer.ln_f.weight"),
                                   tensor(G, "transformer.ln_f.bias"), a.dlnf.data(),
                                   a.x.back().data(), a.lnf_mean.data(), a.lnf_rstd.data(), N, C_);
  }
  if (c.first)
    ops_.embedding_backward(dwte, tensor(G, "transformer.wpe.weight"), a.dx[0].data(),
                            a.tokens.data(), vocab_begin_, Vrows_, B_, T_, C_);
}

void GptModel::layer_backward_weight(int l, Activations& a, int i) {
  const int N = B_ * T_, C = C_, Cl = Cl_;
  LayerTensors g = layer_tensors(grads_.data(), l);
  Activations::Layer& L = a.layers[size_t(i)];
  const float* dout = a.dx[size_t(i) + 1].data();
  ops_.gemm(true, false, 4 * Cl, C, N, 1.0f, L.fch_gelu.data(), dout, 1.0f, g.fcproj_w);
  ops_.bias_backward(g.fcproj_b, dout, N, C);
  ops_.gemm(true, false, C, 4 * Cl, N, 1.0f, L.ln2.data(), L.dfch.data(), 1.0f, g.fc_w);
  ops_.bias_backward(g.fc_b, L.dfch.data(), N, 4 * Cl);
  ops_.layernorm_backward_weight(g.ln2_w, g.ln2_b, L.dln2.data(), L.res2.data(),
                                 L.ln2_mean.data(), L.ln2_rstd.data(), N, C);
  ops_.gemm(true, false, Cl, C, N, 1.0f, L.atty.data(), L.dres2.data(), 1.0f, g.proj_w);
  ops_.bias_backward(g.proj_b, L.dres2.data(), N, C);
  ops_.gemm(true, false, C, 3 * Cl, N, 1.0f, L.ln1.data(), L.dqkv.data(), 1.0f, g.qkv_w);
  ops_.bias_backward(g.qkv_b, L.dqkv.data(), N, 3 * Cl);
  ops_.layernorm_backward_weight(g.ln1_w, g.ln1_b, L.dln1.data(), a.x[size_t(i)].data(),
                                 L.ln1_mean.data(), L.ln1_rstd.data(), N, C);
}

}  // namespace pptrain
