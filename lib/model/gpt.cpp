// GPT-2 forward and split backward for the chunks and tensor-parallel shard a rank
// holds, written against ops::Ops; the tp all-reduces follow Megatron's f/g pairs.
#include "model/gpt.hpp"

#include <cmath>
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
      dt_(ops.compute_dtype()),
      tp_(tp),
      layout_(gpt_param_layout(model, part)),
      params_(ops, layout_.total_floats() * sizeof(float)),
      grads_(ops, layout_.total_floats() * sizeof(float)),
      layer_offsets_(size_t(model.n_layer) * kTensorsPerLayer, SIZE_MAX) {
  PPTRAIN_CHECK(batch >= 1 && C_ % NH_ == 0 && NH_ % part.tp_size == 0, "bad model shape");
  PPTRAIN_CHECK(part.tp_size == 1 || (tp && tp->size() == part.tp_size), "tp group mismatch");
  PPTRAIN_CHECK(!part_.chunks.empty(), "no chunks");
  for (const ChunkSpec& c : part_.chunks)
    for (int l = c.layer_begin; l < c.layer_end; ++l)
      for (int k = 0; k < kTensorsPerLayer; ++k)
        layer_offsets_[size_t(l) * kTensorsPerLayer + k] =
            layout_.at("transformer.h." + std::to_string(l) + "." + kLayerTensorNames[k]).offset;
  if (dt_ != DType::F32) weights_ = ops::Buffer(ops, layout_.total_floats() * dtype_size(dt_));
  params_.zero();
  grads_.zero();
  if (part_.chunks.size() == 1) whole_ = new_activations(0);
}

GptModel::~GptModel() = default;

std::unique_ptr<GptModel::Activations> GptModel::new_activations(int chunk) const {
  const ChunkSpec& c = part_.chunks.at(size_t(chunk));
  const size_t N = size_t(B_) * T_, C = C_, Cl = Cl_;
  ops::Ops& o = ops_;
  const size_t act = dtype_size(dt_);
  auto a = std::make_unique<Activations>();
  a->tokens = ops::Buffer(o, N * sizeof(int32_t));
  a->targets = ops::Buffer(o, N * sizeof(int32_t));
  const int n = c.layer_end - c.layer_begin;
  for (int i = 0; i <= n; ++i) {
    a->x.emplace_back(o, N * C * act);
    a->dx.emplace_back(o, N * C * act);
  }
  a->layers.resize(size_t(n));
  for (auto& L : a->layers) {
    L.ln1 = ops::Buffer(o, N * C * act);
    L.ln1_mean = ops::Buffer(o, N * 4);
    L.ln1_rstd = ops::Buffer(o, N * 4);
    L.qkv = ops::Buffer(o, N * 3 * Cl * act);
    L.att_state = ops::Buffer(o, o.attention_state_bytes(B_, T_, NHl_));
    L.atty = ops::Buffer(o, N * Cl * act);
    L.res2 = ops::Buffer(o, N * C * act);
    L.ln2 = ops::Buffer(o, N * C * act);
    L.ln2_mean = ops::Buffer(o, N * 4);
    L.ln2_rstd = ops::Buffer(o, N * 4);
    L.fch = ops::Buffer(o, N * 4 * Cl * act);
    L.fch_gelu = ops::Buffer(o, N * 4 * Cl * act);
    L.dres2 = ops::Buffer(o, N * C * act);
    L.dfch = ops::Buffer(o, N * 4 * Cl * act);
    L.dln2 = ops::Buffer(o, N * C * act);
    L.dqkv = ops::Buffer(o, N * 3 * Cl * act);
    L.dln1 = ops::Buffer(o, N * C * act);
  }
  if (c.last) {
    a->lnf = ops::Buffer(o, N * C * act);
    a->lnf_mean = ops::Buffer(o, N * 4);
    a->lnf_rstd = ops::Buffer(o, N * 4);
    a->logits = ops::Buffer(o, N * size_t(Vrows_) * act);  // dlogits after a training forward
    a->losses = ops::Buffer(o, N * 4);
    a->dlnf = ops::Buffer(o, N * C * act);
    a->ce_max = ops::Buffer(o, N * 4);
    a->ce_stats = ops::Buffer(o, 2 * N * 4);
    a->host_losses.resize(N);
  }
  return a;
}

std::size_t GptModel::boundary_bytes() const { return size_t(B_) * T_ * C_ * dtype_size(dt_); }

void GptModel::read_params(float* host) const {
  ops_.download(host, params_.get(), params_.bytes());
}

void GptModel::write_params(const float* host) {
  ops_.upload(params_.get(), host, params_.bytes());
  refresh_weights();
}

void GptModel::refresh_weights() {
  if (weights_.get()) ops_.to_compute(weights_.act(), params_.f32(), layout_.total_floats());
}

double gpt_activation_floats(const ModelConfig& m, int batch) {
  // In floating point: at the largest allowed sizes the count exceeds 64 bits.
  const double N = double(batch) * m.seq_len, C = m.d_model, L = m.n_layer;
  const double per_layer = 3 * N + 3 * N + N * 3 * C + double(batch) * m.n_head * m.seq_len *
                               m.seq_len + 4 * N * C + 8 * N * C    // forward values
                           + 3 * N * C + 4 * N * C + 3 * N * C;     // saved gradients
  return L * per_layer + 2 * (L + 1) * N * C + 2 * N * C + 5 * N + N * padded_vocab(m) + N;
}

double gpt_flops_per_token(const ModelConfig& m) {
  const double L = m.n_layer, C = m.d_model, T = m.seq_len, Vp = padded_vocab(m);
  return 72.0 * L * C * C + 6.0 * C * Vp + 12.0 * L * T * C;
}

const ops::Act* GptModel::weight(const char* name) {
  return ops::advance(weights(), layout_.at(name).offset, dt_);
}
float* GptModel::grad(const char* name) { return grads() + layout_.at(name).offset; }

GptModel::LayerTensors<const ops::Act*> GptModel::layer_weights(int layer) {
  const size_t* o = &layer_offsets_[size_t(layer) * kTensorsPerLayer];
  PPTRAIN_CHECK(o[0] != SIZE_MAX, "layer not held by this rank");
  const ops::Act* w = weights();
  auto at = [&](int k) { return ops::advance(w, o[k], dt_); };
  return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11)};
}

GptModel::LayerTensors<float*> GptModel::layer_grads(int layer) {
  const size_t* o = &layer_offsets_[size_t(layer) * kTensorsPerLayer];
  PPTRAIN_CHECK(o[0] != SIZE_MAX, "layer not held by this rank");
  float* g = grads();
  return {g + o[0], g + o[1], g + o[2], g + o[3], g + o[4],  g + o[5],
          g + o[6], g + o[7], g + o[8], g + o[9], g + o[10], g + o[11]};
}

void GptModel::all_reduce_tp(ops::Act* data, std::size_t n) {
  if (part_.tp_size > 1) tp_->all_reduce(data, n, dt_);
}

void GptModel::zero_grads() { grads_.zero(); }

ops::Act* GptModel::input_buffer(Activations& a) const { return a.x.front().act(); }
ops::Act* GptModel::output(Activations& a) const { return a.x.back().act(); }
ops::Act* GptModel::output_grad(Activations& a) const { return a.dx.back().act(); }
ops::Act* GptModel::input_grad(Activations& a) const { return a.dx.front().act(); }
const std::vector<float>& GptModel::position_losses(const Activations& a) const {
  return a.host_losses;
}
const std::vector<float>& GptModel::position_losses() const { return whole_->host_losses; }

float GptModel::forward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  return forward(0, *whole_, tokens, nullptr, targets, loss_scale);
}
void GptModel::backward_input() { backward_input(0, *whole_); }
void GptModel::backward_weight() { backward_weight(0, *whole_); }

float GptModel::forward(int chunk, Activations& a, const int32_t* tokens, const ops::Act* input,
                        const int32_t* targets, float loss_scale) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const size_t N = size_t(B_) * T_;
  if (c.first) {
    ops_.upload(a.tokens.get(), tokens, sizeof(int32_t) * N);
    embed(a);
  } else if (input != a.x[0].act()) {
    ops_.copy(a.x[0].get(), input, boundary_bytes());
  }
  for (int l = c.layer_begin; l < c.layer_end; ++l) layer_forward(l, a, l - c.layer_begin);
  if (!c.last) return 0.0f;
  ops_.upload(a.targets.get(), targets, sizeof(int32_t) * N);
  return head_forward(a, loss_scale);
}

void GptModel::embed(Activations& a) {
  ops::Act* x0 = a.x[0].act();
  const ops::Act* wpe = weight("transformer.wpe.weight");
  const ops::Act* wte = weight("transformer.wte.weight");
  if (part_.tp_size == 1) {
    ops_.embedding_forward(x0, a.tokens.i32(), wte, 0, Vrows_, wpe, B_, T_, C_);
    return;
  }
  // Vocab-parallel: each shard looks up its own rows, the sum assembles the embedding;
  // the positions are then added to every sequence (a "bias" of T*C per row of B).
  ops_.embedding_forward(x0, a.tokens.i32(), wte, vocab_begin_, Vrows_, nullptr, B_, T_, C_);
  all_reduce_tp(x0, size_t(B_) * T_ * C_);
  ops_.add_bias(x0, wpe, B_, T_ * C_);
}

float GptModel::head_forward(Activations& a, float loss_scale) {
  const int N = B_ * T_, V = cfg_.vocab_size;
  const ops::Act* wte = weight("transformer.wte.weight");
  ops_.layernorm_forward(a.lnf.act(), a.lnf_mean.f32(), a.lnf_rstd.f32(), a.x.back().act(),
                         weight("transformer.ln_f.weight"), weight("transformer.ln_f.bias"), N, C_);
  // Tied head: logits[N, Vrows] = lnf[N,C] @ wte_shard[Vrows,C]^T.
  ops_.gemm(false, true, N, Vrows_, C_, 1.0f, a.lnf.act(), wte, 0.0f, a.logits.act());
  // With a loss scale the cross-entropy also turns the logits into dlogits in place.
  ops::Act* dlogits = loss_scale > 0 ? a.logits.act() : nullptr;
  const float dloss = loss_scale / float(N);
  if (part_.tp_size == 1) {
    ops_.cross_entropy(a.losses.f32(), dlogits, a.logits.act(), a.targets.i32(), N, V, Vrows_,
                       dloss);
  } else {  // vocab-parallel: full logits are never gathered
    ops_.ce_row_max(a.ce_max.f32(), a.logits.act(), N, Vrows_, vocab_begin_, V);
    tp_->all_reduce(a.ce_max.f32(), size_t(N), comm::ReduceOp::Max);
    ops_.ce_partial_sums(a.ce_stats.f32(), a.logits.act(), a.ce_max.f32(), a.targets.i32(), N,
                         Vrows_, vocab_begin_, V);
    tp_->all_reduce(a.ce_stats.f32(), 2 * size_t(N), comm::ReduceOp::Sum);
    ops_.ce_finish(a.losses.f32(), dlogits, a.logits.act(), a.ce_max.f32(), a.ce_stats.f32(),
                   a.targets.i32(), N, Vrows_, vocab_begin_, V, dloss);
  }
  ops_.download(a.host_losses.data(), a.losses.get(), sizeof(float) * size_t(N));
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += a.host_losses[size_t(i)];
  return float(sum / N);
}

void GptModel::layer_forward(int l, Activations& a, int i) {
  const int N = B_ * T_, C = C_, Cl = Cl_;
  const auto w = layer_weights(l);
  Activations::Layer& L = a.layers[size_t(i)];
  const ops::Act* x = a.x[size_t(i)].act();
  ops::Act* out = a.x[size_t(i) + 1].act();
  const size_t NC = size_t(N) * C;
  ops_.layernorm_forward(L.ln1.act(), L.ln1_mean.f32(), L.ln1_rstd.f32(), x, w.ln1_w, w.ln1_b, N,
                         C);
  ops_.linear_forward(L.qkv.act(), nullptr, L.ln1.act(), w.qkv_w, w.qkv_b, N, C, 3 * Cl);
  ops_.attention_forward(L.atty.act(), L.att_state.get(), L.qkv.act(), B_, T_, Cl, NHl_);
  // Row-parallel projections: the bias is added once, after the all-reduce.
  ops_.linear_forward(L.res2.act(), nullptr, L.atty.act(), w.proj_w, nullptr, N, Cl, C);
  all_reduce_tp(L.res2.act(), NC);
  ops_.add_bias(L.res2.act(), w.proj_b, N, C);
  ops_.add(L.res2.act(), L.res2.act(), x, NC);
  ops_.layernorm_forward(L.ln2.act(), L.ln2_mean.f32(), L.ln2_rstd.f32(), L.res2.act(), w.ln2_w,
                         w.ln2_b, N, C);
  ops_.linear_forward(L.fch.act(), L.fch_gelu.act(), L.ln2.act(), w.fc_w, w.fc_b, N, C, 4 * Cl);
  ops_.linear_forward(out, nullptr, L.fch_gelu.act(), w.fcproj_w, nullptr, N, 4 * Cl, C);
  all_reduce_tp(out, NC);
  ops_.add_bias(out, w.fcproj_b, N, C);
  ops_.add(out, out, L.res2.act(), NC);
}

void GptModel::backward_input(int chunk, Activations& a) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  if (c.last) head_backward_input(a);
  for (int l = c.layer_end - 1; l >= c.layer_begin; --l)
    layer_backward_input(l, a, l - c.layer_begin);
}

void GptModel::head_backward_input(Activations& a) {
  const int N = B_ * T_;
  ops_.gemm(false, false, N, C_, Vrows_, 1.0f, a.logits.act(), weight("transformer.wte.weight"),
            0.0f, a.dlnf.act());
  all_reduce_tp(a.dlnf.act(), size_t(N) * C_);  // the vocab shards' contributions
  a.dx.back().zero();
  ops_.layernorm_backward_input(a.dx.back().act(), a.dlnf.act(), a.x.back().act(),
                                weight("transformer.ln_f.weight"), a.lnf_mean.f32(),
                                a.lnf_rstd.f32(), N, C_);
}

void GptModel::layer_backward_input(int l, Activations& a, int i) {
  const int N = B_ * T_, C = C_, Cl = Cl_;
  const size_t NC = size_t(N) * C;
  const auto w = layer_weights(l);
  Activations::Layer& L = a.layers[size_t(i)];
  const ops::Act* dout = a.dx[size_t(i) + 1].act();
  // MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  ops_.gemm(false, true, N, 4 * Cl, C, 1.0f, dout, w.fcproj_w, 0.0f, L.dfch.act());
  ops_.gelu_backward(L.dfch.act(), L.fch.act(), L.dfch.act(), size_t(N) * 4 * Cl);
  ops_.gemm(false, true, N, C, 4 * Cl, 1.0f, L.dfch.act(), w.fc_w, 0.0f, L.dln2.act());
  all_reduce_tp(L.dln2.act(), NC);  // column-parallel input gradient
  ops_.copy(L.dres2.get(), dout, boundary_bytes());
  ops_.layernorm_backward_input(L.dres2.act(), L.dln2.act(), L.res2.act(), w.ln2_w,
                                L.ln2_mean.f32(), L.ln2_rstd.f32(), N, C);
  // Attention: res2 = x + proj(attn(qkv(ln1(x)))).
  ops::Act* dx = a.dx[size_t(i)].act();
  ops::Act* datty = dx;  // scratch [N, Cl] until dx is written below
  ops_.gemm(false, true, N, Cl, C, 1.0f, L.dres2.act(), w.proj_w, 0.0f, datty);
  ops_.attention_backward(L.dqkv.act(), datty, L.qkv.act(), L.atty.act(), L.att_state.get(), B_,
                          T_, Cl, NHl_);
  ops_.gemm(false, true, N, C, 3 * Cl, 1.0f, L.dqkv.act(), w.qkv_w, 0.0f, L.dln1.act());
  all_reduce_tp(L.dln1.act(), NC);  // column-parallel input gradient
  ops_.copy(dx, L.dres2.get(), boundary_bytes());
  ops_.layernorm_backward_input(dx, L.dln1.act(), a.x[size_t(i)].act(), w.ln1_w,
                                L.ln1_mean.f32(), L.ln1_rstd.f32(), N, C);
}

void GptModel::backward_weight(int chunk, Activations& a) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const int N = B_ * T_;
  for (int l = c.layer_end - 1; l >= c.layer_begin; --l)
    layer_backward_weight(l, a, l - c.layer_begin);
  float* dwte = c.first || c.last ? grad("transformer.wte.weight") : nullptr;
  if (c.last) {  // tied head: dwte += dlogits^T @ lnf; final LayerNorm
    ops_.linear_weight_grad(dwte, a.logits.act(), a.lnf.act(), N, Vrows_, C_);
    ops_.layernorm_backward_weight(grad("transformer.ln_f.weight"), grad("transformer.ln_f.bias"),
                                   a.dlnf.act(), a.x.back().act(), a.lnf_mean.f32(),
                                   a.lnf_rstd.f32(), N, C_);
  }
  if (c.first)
    ops_.embedding_backward(dwte, grad("transformer.wpe.weight"), a.dx[0].act(), a.tokens.i32(),
                            vocab_begin_, Vrows_, B_, T_, C_);
}

void GptModel::layer_backward_weight(int l, Activations& a, int i) {
  const int N = B_ * T_, C = C_, Cl = Cl_;
  const auto g = layer_grads(l);
  Activations::Layer& L = a.layers[size_t(i)];
  const ops::Act* dout = a.dx[size_t(i) + 1].act();
  ops_.linear_weight_grad(g.fcproj_w, L.fch_gelu.act(), dout, N, 4 * Cl, C);
  ops_.bias_backward(g.fcproj_b, dout, N, C);
  ops_.linear_weight_grad(g.fc_w, L.ln2.act(), L.dfch.act(), N, C, 4 * Cl);
  ops_.bias_backward(g.fc_b, L.dfch.act(), N, 4 * Cl);
  ops_.layernorm_backward_weight(g.ln2_w, g.ln2_b, L.dln2.act(), L.res2.act(), L.ln2_mean.f32(),
                                 L.ln2_rstd.f32(), N, C);
  ops_.linear_weight_grad(g.proj_w, L.atty.act(), L.dres2.act(), N, Cl, C);
  ops_.bias_backward(g.proj_b, L.dres2.act(), N, C);
  ops_.linear_weight_grad(g.qkv_w, L.ln1.act(), L.dqkv.act(), N, C, 3 * Cl);
  ops_.bias_backward(g.qkv_b, L.dqkv.act(), N, 3 * Cl);
  ops_.layernorm_backward_weight(g.ln1_w, g.ln1_b, L.dln1.act(), a.x[size_t(i)].act(),
                                 L.ln1_mean.f32(), L.ln1_rstd.f32(), N, C);
}

}  // namespace pptrain
