// GPT-2 forward and split backward for the chunks and tensor-parallel shard a rank
// holds, written against ops::Ops. LayerNorms, biases after row-parallel linears and
// residual adds run on the rows this rank holds (all N, or N / tp under sequence
// parallelism); the linears and attention on all N rows (tp_regions.hpp).
#include "model/gpt.hpp"

#include <algorithm>
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
                   const ModelPartition& part, comm::Group* tp, const ActivationPolicy& policy,
                   Master master)
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
      tp_(tp, ops.compute_dtype(), part.tp_size, part.tp_rank, policy.sequence_parallel,
          batch * model.seq_len),
      layout_(gpt_param_layout(model, part)),
      params_(master == Master::InModel
                  ? ops::Buffer::zeroed(ops, layout_.total_floats() * sizeof(float), "the parameter arena")
                  : ops::Buffer()),
      grads_(ops::Buffer::zeroed(ops, layout_.total_floats() * sizeof(float), "the gradient arena")),
      layer_offsets_(size_t(model.n_layer) * kTensorsPerLayer, SIZE_MAX),
      policy_(policy) {
  PPTRAIN_CHECK(batch >= 1 && C_ % NH_ == 0 && NH_ % part.tp_size == 0, "bad model shape");
  PPTRAIN_CHECK(!part_.chunks.empty(), "no chunks");
  PPTRAIN_CHECK(master == Master::InModel || dt_ != DType::F32,
                "only a model with a weight copy leaves its master weights to the optimizer");
  for (const ChunkSpec& c : part_.chunks)
    for (int l = c.layer_begin; l < c.layer_end; ++l)
      for (int k = 0; k < kTensorsPerLayer; ++k)
        layer_offsets_[size_t(l) * kTensorsPerLayer + k] =
            layout_.at("transformer.h." + std::to_string(l) + "." + kLayerTensorNames[k]).offset;
  if (dt_ != DType::F32)
    weights_ = ops::Buffer(ops, layout_.total_floats() * dtype_size(dt_), "the weight copy");
  init_activation_layouts();
}

GptModel::~GptModel() = default;

void GptModel::read_params(float* host) const {
  PPTRAIN_CHECK(params_.get(), "the master weights are the optimizer's");
  ops_.download(host, params_.get(), params_.bytes());
}

void GptModel::write_params(const float* host) {
  const ops::Buffer& staging = params_.get() ? params_ : grads_;
  ops_.upload(staging.get(), host, staging.bytes());
  if (weights_.get()) ops_.to_compute(weights_.act(), staging.f32(), layout_.total_floats());
  if (!params_.get()) zero_grads();
}

void GptModel::refresh_weights() {
  if (weights_.get() && params_.get())
    ops_.to_compute(weights_.act(), params_.f32(), layout_.total_floats());
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

void GptModel::zero_grads() { grads_.zero(); }

const std::vector<float>& GptModel::position_losses(const Set& set) const {
  return activations(set).host_losses;
}
const std::vector<float>& GptModel::position_losses() const { return whole_->host_losses; }

float GptModel::forward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  PPTRAIN_CHECK(part_.chunks.size() == 1, "the whole-model helpers need a single chunk");
  if (!whole_) whole_ = new_activations(0);
  return forward(0, *whole_, tokens, nullptr, targets, loss_scale);
}
void GptModel::backward_input() { backward_input(0, *whole_); }
void GptModel::backward_weight() { backward_weight(0, *whole_); }

float GptModel::forward(int chunk, Set& set, const int32_t* tokens, const ops::Act* input,
                        const int32_t* targets, float loss_scale, double* loss_total) {
  Activations& a = activations(set);
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const int n = c.layer_end - c.layer_begin;
  const size_t N = size_t(B_) * T_;
  lend(a, Lifetime::UntilB);
  output(a);  // lent here, unless it is the next chunk's input on this rank
  a.weight_done = false;
  if (c.first) {
    ops_.upload(act(a, Slot::tokens), tokens, sizeof(int32_t) * N);
    embed(a);
  } else if (input != input_buffer(a)) {
    ops_.copy(input_buffer(a), input, boundary_bytes());
  }
  for (int i = 0; i < n; ++i) layer_forward(c.layer_begin + i, layer_view(a, i, Pass::Forward));
  if (!c.last) return 0.0f;
  ops_.upload(act(a, Slot::targets), targets, sizeof(int32_t) * N);
  return head_forward(a, loss_scale, loss_total);
}

void GptModel::embed(Activations& a) {
  ops::Act* x0 = input_buffer(a);
  const int32_t* tokens = static_cast<const int32_t*>(slot(a, 0, Slot::tokens));
  const ops::Act* wpe = weight("transformer.wpe.weight");
  const ops::Act* wte = weight("transformer.wte.weight");
  if (part_.tp_size == 1) {
    ops_.embedding_forward(x0, tokens, wte, 0, Vrows_, wpe, B_, T_, C_);
    return;
  }
  // Vocab-parallel: each shard looks up its own rows, the sum over tp assembles the
  // embedding (of the held rows); the positions are added to those rows after.
  ops::Act* partial = tp_.partial_target(x0, act(a, Slot::sp_scratch));
  ops_.embedding_forward(partial, tokens, wte, vocab_begin_, Vrows_, nullptr, B_, T_, C_);
  tp_.reduce(partial, x0, C_);
  add_positions(x0);
}

// x (the held rows) += wpe[position of each row], one add_bias per run of consecutive
// positions: whole sequences in one call, a partial sequence at either end.
void GptModel::add_positions(ops::Act* x) {
  const ops::Act* wpe = weight("transformer.wpe.weight");
  const int begin = tp_.first_row(), end = begin + tp_.rows_held();
  int row = begin;
  while (row < end) {
    const int pos = row % T_;
    const int whole = pos == 0 ? (end - row) / T_ : 0;  // whole sequences from here
    const int rows = whole > 0 ? whole * T_ : std::min(T_ - pos, end - row);
    ops::Act* at = ops::advance(x, size_t(row - begin) * C_, dt_);
    if (whole > 0) ops_.add_bias(at, wpe, whole, T_ * C_);
    else ops_.add_bias(at, ops::advance(wpe, size_t(pos) * C_, dt_), 1, rows * C_);
    row += rows;
  }
}

float GptModel::head_forward(Activations& a, float loss_scale, double* loss_total) {
  const int N = B_ * T_, V = cfg_.vocab_size;
  const ops::Act* wte = weight("transformer.wte.weight");
  ops::Act *lnf = act(a, Slot::lnf), *logits = act(a, Slot::logits);
  float *losses = f32(a, Slot::losses), *ce_max = f32(a, Slot::ce_max);
  float* ce_stats = f32(a, Slot::ce_stats);
  const int32_t* targets = static_cast<const int32_t*>(slot(a, 0, Slot::targets));
  // The final LayerNorm writes its rows into their place in lnf, gathered there in place.
  ops::Act* lnf_held = ops::advance(lnf, size_t(tp_.first_row()) * C_, dt_);
  ops_.layernorm_forward(lnf_held, f32(a, Slot::lnf_mean), f32(a, Slot::lnf_rstd), output(a),
                         weight("transformer.ln_f.weight"), weight("transformer.ln_f.bias"),
                         tp_.rows_held(), C_);
  tp_.gather(lnf_held, lnf, C_);
  // Tied head: logits[N, Vrows] = lnf[N,C] @ wte_shard[Vrows,C]^T.
  ops_.gemm(false, true, N, Vrows_, C_, 1.0f, lnf, wte, 0.0f, logits);
  // With a loss scale the cross-entropy also turns the logits into dlogits in place.
  ops::Act* dlogits = loss_scale > 0 ? logits : nullptr;
  const float dloss = loss_scale / float(N);
  if (part_.tp_size == 1) {
    ops_.cross_entropy(losses, dlogits, logits, targets, N, V, Vrows_, dloss);
  } else {  // vocab-parallel: full logits are never gathered
    ops_.ce_row_max(ce_max, logits, N, Vrows_, vocab_begin_, V);
    tp_.reduce_stats(ce_max, size_t(N), comm::ReduceOp::Max);
    ops_.ce_partial_sums(ce_stats, logits, ce_max, targets, N, Vrows_, vocab_begin_, V);
    tp_.reduce_stats(ce_stats, 2 * size_t(N), comm::ReduceOp::Sum);
    ops_.ce_finish(losses, dlogits, logits, ce_max, ce_stats, targets, N, Vrows_, vocab_begin_, V,
                   dloss);
  }
  if (loss_total) {
    ops_.add_mean(loss_total, losses, size_t(N));
    return 0.0f;
  }
  ops_.download(a.host_losses.data(), losses, sizeof(float) * size_t(N));
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += a.host_losses[size_t(i)];
  return float(sum / N);
}

void GptModel::layer_forward(int l, const LayerView& v) {
  const int N = B_ * T_, Nh = tp_.rows_held(), C = C_, Cl = Cl_;
  const auto w = layer_weights(l);
  const size_t NhC = size_t(Nh) * C;
  ops_.layernorm_forward(v.ln1, v.ln1_mean, v.ln1_rstd, v.x, w.ln1_w, w.ln1_b, Nh, C);
  const ops::Act* ln1 = tp_.gather(v.ln1, v.ln1_gathered, C);
  ops_.linear_forward(v.qkv, nullptr, ln1, w.qkv_w, w.qkv_b, N, C, 3 * Cl);
  ops_.attention_forward(v.atty, v.att_state, v.qkv, B_, T_, Cl, NHl_);
  // Row-parallel projections: the bias is added once, after the tp sum.
  ops::Act* proj = tp_.partial_target(v.res2, v.partial);
  ops_.linear_forward(proj, nullptr, v.atty, w.proj_w, nullptr, N, Cl, C);
  tp_.reduce(proj, v.res2, C);
  ops_.add_bias(v.res2, w.proj_b, Nh, C);
  ops_.add(v.res2, v.res2, v.x, NhC);
  ops_.layernorm_forward(v.ln2, v.ln2_mean, v.ln2_rstd, v.res2, w.ln2_w, w.ln2_b, Nh, C);
  const ops::Act* ln2 = tp_.gather(v.ln2, v.ln2_gathered, C);
  ops_.linear_forward(v.fch, v.fch_gelu, ln2, w.fc_w, w.fc_b, N, C, 4 * Cl);
  ops::Act* fcproj = tp_.partial_target(v.out, v.partial);
  ops_.linear_forward(fcproj, nullptr, v.fch_gelu, w.fcproj_w, nullptr, N, 4 * Cl, C);
  tp_.reduce(fcproj, v.out, C);
  ops_.add_bias(v.out, w.fcproj_b, Nh, C);
  ops_.add(v.out, v.out, v.res2, NhC);
}

// Recomputes what B (and W) of a recomputed layer read and the forward did not keep,
// with the forward's own operations on the same inputs: the same values, bit for bit.
void GptModel::recompute(int l, int i, LayerView& v) {
  const Recompute mode = policy_.mode_of(i);
  if (mode == Recompute::Full) {
    LayerView r = v;
    r.out = v.recomputed_out;  // the output is kept: the next layer's input
    layer_forward(l, r);
  } else if (mode == Recompute::Selective) {  // the attention core: its softmax state
    ops_.attention_forward(v.atty, v.att_state, v.qkv, B_, T_, Cl_, NHl_);
  }
}

void GptModel::backward_input(int chunk, Set& set, const LayerFn& layer_done) {
  Activations& a = activations(set);
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const bool fused = fused_backward_[size_t(chunk)];
  lend(a, Lifetime::FromB);
  input_grad(a);  // lent here, unless it is the previous chunk's output_grad on this rank
  if (c.last) head_backward_input(a);
  for (int l = c.layer_end - 1; l >= c.layer_begin; --l) {
    const int i = l - c.layer_begin;
    LayerView v = layer_view(a, i, Pass::Input);
    recompute(l, i, v);
    layer_backward_input(l, v);
    if (fused) {
      layer_backward_weight(l, v);
      if (layer_done) layer_done(l);
    }
  }
  give_back(a, Lifetime::UntilB);
  if (fused) {
    chunk_backward_weight(chunk, a);
    a.weight_done = true;
    give_back(a, Lifetime::FromB);
  }
}

void GptModel::head_backward_input(Activations& a) {
  const int N = B_ * T_;
  ops::Act* dlnf = act(a, Slot::dlnf);
  ops::Act* partial = tp_.partial_target(dlnf, act(a, Slot::sp_scratch));
  ops_.gemm(false, false, N, C_, Vrows_, 1.0f, act(a, Slot::logits),
            weight("transformer.wte.weight"), 0.0f, partial);
  tp_.reduce(partial, dlnf, C_);  // the vocab shards' contributions
  ops::Act* dout = output_grad(a);
  ops_.fill_zero(dout, boundary_bytes());
  ops_.layernorm_backward_input(dout, dlnf, output(a), weight("transformer.ln_f.weight"),
                                f32(a, Slot::lnf_mean), f32(a, Slot::lnf_rstd), tp_.rows_held(), C_);
}

void GptModel::layer_backward_input(int l, const LayerView& v) {
  const int N = B_ * T_, Nh = tp_.rows_held(), C = C_, Cl = Cl_;
  const size_t held_bytes = size_t(Nh) * C * dtype_size(dt_);
  const auto w = layer_weights(l);
  // MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  const ops::Act* dout = tp_.gather(v.dout, v.dout_gathered, C);
  ops_.linear_backward_input(v.dfch, dout, w.fcproj_w, v.fch, N, 4 * Cl, C);
  ops::Act* dln2 = tp_.partial_target(v.dln2, v.partial);
  ops_.gemm(false, true, N, C, 4 * Cl, 1.0f, v.dfch, w.fc_w, 0.0f, dln2);
  tp_.reduce(dln2, v.dln2, C);  // column-parallel input gradient
  ops_.copy(v.dres2, v.dout, held_bytes);
  ops_.layernorm_backward_input(v.dres2, v.dln2, v.res2, w.ln2_w, v.ln2_mean, v.ln2_rstd, Nh, C);
  // Attention: res2 = x + proj(attn(qkv(ln1(x)))).
  const ops::Act* dres2 = tp_.gather(v.dres2, v.dres2_gathered, C);
  ops::Act* datty = v.dx;  // scratch [N, Cl] (the size of dx's held rows) until dx is written
  ops_.gemm(false, true, N, Cl, C, 1.0f, dres2, w.proj_w, 0.0f, datty);
  ops_.attention_backward(v.dqkv, datty, v.qkv, v.atty, v.att_state, B_, T_, Cl, NHl_);
  ops::Act* dln1 = tp_.partial_target(v.dln1, v.partial);
  ops_.gemm(false, true, N, C, 3 * Cl, 1.0f, v.dqkv, w.qkv_w, 0.0f, dln1);
  tp_.reduce(dln1, v.dln1, C);  // column-parallel input gradient
  ops_.copy(v.dx, v.dres2, held_bytes);
  ops_.layernorm_backward_input(v.dx, v.dln1, v.x, w.ln1_w, v.ln1_mean, v.ln1_rstd, Nh, C);
}

void GptModel::backward_weight(int chunk, Set& set, const LayerFn& layer_done) {
  Activations& a = activations(set);
  if (a.weight_done) return;  // the fused backward ran it
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  for (int l = c.layer_end - 1; l >= c.layer_begin; --l) {
    layer_backward_weight(l, layer_view(a, l - c.layer_begin, Pass::Weight));
    if (layer_done) layer_done(l);
  }
  chunk_backward_weight(chunk, a);
  a.weight_done = true;
  give_back(a, Lifetime::FromB);
}

void GptModel::chunk_backward_weight(int chunk, Activations& a) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const int N = B_ * T_;
  float* dwte = c.first || c.last ? grad("transformer.wte.weight") : nullptr;
  if (c.last) {  // tied head: dwte += dlogits^T @ lnf; final LayerNorm (its held rows)
    ops_.linear_weight_grad(dwte, act(a, Slot::logits), act(a, Slot::lnf), N, Vrows_, C_);
    ops_.layernorm_backward_weight(grad("transformer.ln_f.weight"), grad("transformer.ln_f.bias"),
                                   act(a, Slot::dlnf), output(a), f32(a, Slot::lnf_mean),
                                   f32(a, Slot::lnf_rstd), tp_.rows_held(), C_);
  }
  if (c.first)  // every rank's token rows: its vocab rows of wte, all of wpe
    ops_.embedding_backward(dwte, grad("transformer.wpe.weight"),
                            tp_.gather(input_grad(a), act(a, Slot::sp_scratch), C_),
                            static_cast<const int32_t*>(slot(a, 0, Slot::tokens)), vocab_begin_,
                            Vrows_, B_, T_, C_);
}

// LayerNorm gradients cover the held rows; under sequence parallelism GradSync sums them
// over tp. The row-parallel biases' gradients come from the gathered output gradients,
// so they are whole on every rank.
void GptModel::layer_backward_weight(int l, const LayerView& v) {
  const int N = B_ * T_, Nh = tp_.rows_held(), C = C_, Cl = Cl_;
  const auto g = layer_grads(l);
  const ops::Act* dout = tp_.gathered(v.dout, v.dout_gathered);
  ops_.linear_weight_grad(g.fcproj_w, v.fch_gelu, dout, N, 4 * Cl, C);
  ops_.bias_backward(g.fcproj_b, dout, N, C);
  ops_.linear_weight_grad(g.fc_w, tp_.gather(v.ln2, v.ln2_gathered, C), v.dfch, N, C, 4 * Cl);
  ops_.bias_backward(g.fc_b, v.dfch, N, 4 * Cl);
  ops_.layernorm_backward_weight(g.ln2_w, g.ln2_b, v.dln2, v.res2, v.ln2_mean, v.ln2_rstd, Nh, C);
  const ops::Act* dres2 = tp_.gathered(v.dres2, v.dres2_gathered);
  ops_.linear_weight_grad(g.proj_w, v.atty, dres2, N, Cl, C);
  ops_.bias_backward(g.proj_b, dres2, N, C);
  ops_.linear_weight_grad(g.qkv_w, tp_.gather(v.ln1, v.ln1_gathered, C), v.dqkv, N, C, 3 * Cl);
  ops_.bias_backward(g.qkv_b, v.dqkv, N, 3 * Cl);
  ops_.layernorm_backward_weight(g.ln1_w, g.ln1_b, v.dln1, v.x, v.ln1_mean, v.ln1_rstd, Nh, C);
}

}  // namespace pptrain

namespace pptrain {

std::unique_ptr<Model> make_model(const ModelConfig& config, int batch, ops::Ops& ops,
                                  const ModelPartition& part, comm::Group* tp,
                                  const ActivationPolicy& policy, Model::Master master) {
  return std::make_unique<GptModel>(config, batch, ops, part, tp, policy, master);
}

}  // namespace pptrain
