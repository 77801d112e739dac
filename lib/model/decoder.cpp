// The decoder's chunk passes, embedding and head for the chunks and tensor-parallel shard
// a rank holds, written against ops::Ops. Norms and residual adds run on the rows this
// rank holds (all N, or N / tp under sequence parallelism); the linears and attention on
// all N rows (tp_regions.hpp). The layers themselves are the arch's (gpt.cpp, llama.cpp).
#include "model/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"

namespace pptrain {

DecoderModel::DecoderModel(const ModelConfig& model, int batch, ops::Ops& ops,
                           const ModelPartition& part, comm::Group* tp,
                           const ActivationPolicy& policy, Master master,
                           const ContextRing& ring)
    : cfg_(model),
      part_(part),
      split_(ring.active() ? ring.split : SequenceSplit{1, 0, model.seq_len}),
      B_(batch),
      T_(split_.local_len()),
      C_(model.d_model),
      NHl_(model.n_head / part.tp_size),
      NKVl_(kv_heads(model) / part.tp_size),
      hs_(head_size(model)),
      Vrows_(vocab_rows_per_shard(model, part.tp_size)),
      vocab_begin_(part.tp_rank * vocab_rows_per_shard(model, part.tp_size)),
      ops_(ops),
      dt_(ops.compute_dtype()),
      tp_(tp, ops.compute_dtype(), part.tp_size, part.tp_rank, policy.sequence_parallel,
          batch * T_, policy.overlap_tensor_parallel),
      layout_(param_layout(model, part)),
      params_(master == Master::InModel
                  ? ops::Buffer::zeroed(ops, layout_.total_floats() * sizeof(float), "the parameter arena")
                  : ops::Buffer()),
      grads_(ops::Buffer::zeroed(ops, layout_.total_floats() * sizeof(float), "the gradient arena")),
      policy_(policy) {
  PPTRAIN_CHECK(batch >= 1 && C_ % model.n_head == 0 && model.n_head % part.tp_size == 0 &&
                    kv_heads(model) % part.tp_size == 0 && NHl_ % NKVl_ == 0,
                "bad model shape");
  PPTRAIN_CHECK(!part_.chunks.empty(), "no chunks");
  PPTRAIN_CHECK(master == Master::InModel || dt_ != DType::F32,
                "only a model with a weight copy leaves its master weights to the optimizer");
  if (dt_ != DType::F32)
    weights_ = ops::Buffer(ops, layout_.total_floats() * dtype_size(dt_), "the weight copy");
  if (ring.active()) ring_ = std::make_unique<RingAttention>(ops, ring, B_, NHl_ * hs_, NHl_, NKVl_);
}

std::vector<std::size_t> DecoderModel::layer_offsets(const std::vector<std::string>& names) const {
  std::vector<std::size_t> offsets(std::size_t(cfg_.n_layer) * names.size(), SIZE_MAX);
  for (const ChunkSpec& c : part_.chunks)
    for (int l = c.layer_begin; l < c.layer_end; ++l)
      for (std::size_t k = 0; k < names.size(); ++k)
        offsets[std::size_t(l) * names.size() + k] =
            layout_.at(layer_prefix(cfg_.arch, l) + names[k]).offset;
  return offsets;
}

DecoderModel::~DecoderModel() = default;

void DecoderModel::read_params(float* host) const {
  PPTRAIN_CHECK(params_.get(), "the master weights are the optimizer's");
  ops_.download(host, params_.get(), params_.bytes());
}

void DecoderModel::write_params(const float* host) {
  const ops::Buffer& staging = params_.get() ? params_ : grads_;
  ops_.upload(staging.get(), host, staging.bytes());
  if (weights_.get()) ops_.to_compute(weights_.act(), staging.f32(), layout_.total_floats());
  if (!params_.get()) zero_grads();
}

void DecoderModel::refresh_weights() {
  if (weights_.get() && params_.get())
    ops_.to_compute(weights_.act(), params_.f32(), layout_.total_floats());
}

const ops::Act* DecoderModel::weight(const std::string& name) {
  return ops::advance(weights(), layout_.at(name).offset, dt_);
}
float* DecoderModel::grad(const std::string& name) { return grads() + layout_.at(name).offset; }

void DecoderModel::zero_grads() { grads_.zero(); }

const std::vector<float>& DecoderModel::position_losses(const Set& set) const {
  return activations(set).host_losses;
}
const std::vector<float>& DecoderModel::position_losses() const { return whole_->host_losses; }

float DecoderModel::forward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  PPTRAIN_CHECK(part_.chunks.size() == 1, "the whole-model helpers need a single chunk");
  if (!whole_) whole_ = new_activations(0);
  return forward(0, *whole_, tokens, nullptr, targets, loss_scale);
}
void DecoderModel::backward_input() { backward_input(0, *whole_); }
void DecoderModel::backward_weight() { backward_weight(0, *whole_); }

float DecoderModel::forward(int chunk, Set& set, const int32_t* tokens, const ops::Act* input,
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

void DecoderModel::embed(Activations& a) {
  ops::Act* x0 = input_buffer(a);
  const int32_t* tokens = static_cast<const int32_t*>(slot(a, 0, Slot::tokens));
  const ops::Act* table = weight(embedding_name());
  if (part_.tp_size == 1 && split_.cp == 1) {
    ops_.embedding_forward(x0, tokens, table, 0, Vrows_, position_table(), B_, T_, C_);
    return;
  }
  // Vocab-parallel: each shard looks up its own rows, the sum over tp assembles the
  // embedding (of the held rows); the positions are added to those rows after.
  ops::Act* partial = tp_.partial_target(x0, act(a, Slot::sp_scratch));
  ops_.embedding_forward(partial, tokens, table, vocab_begin_, Vrows_, nullptr, B_, T_, C_);
  tp_.reduce(partial, x0, C_);
  if (position_table()) add_positions(x0);
}

// x (the held rows) += the position table's row of each row's position, one add_bias per
// run of consecutive positions: the whole pieces of a run of sequences in one call, a
// partial piece at either end. Rows are piece-major (sequence_split.hpp): row
// (piece, b, t) is at position first(piece) + t.
void DecoderModel::add_positions(ops::Act* x) {
  const ops::Act* positions = position_table();
  const int len = split_.piece_len(), piece_rows = B_ * len;
  const int begin = tp_.first_row(), end = begin + tp_.rows_held();
  int row = begin;
  while (row < end) {
    const int piece = row / piece_rows, t = row % len;
    const int run_end = std::min(end, (piece + 1) * piece_rows);  // this piece's rows held
    const int whole = t == 0 ? (run_end - row) / len : 0;  // whole sequences from here
    const int rows = whole > 0 ? whole * len : std::min(len - t, run_end - row);
    const ops::Act* from = ops::advance(positions, size_t(split_.first(piece) + t) * C_, dt_);
    ops::Act* at = ops::advance(x, size_t(row - begin) * C_, dt_);
    if (whole > 0) ops_.add_bias(at, from, whole, len * C_);
    else ops_.add_bias(at, from, 1, rows * C_);
    row += rows;
  }
}

float DecoderModel::head_forward(Activations& a, float loss_scale, double* loss_total) {
  const int N = B_ * T_, V = cfg_.vocab_size;
  ops::Act *lnf = act(a, Slot::lnf), *logits = act(a, Slot::logits);
  float *losses = f32(a, Slot::losses), *ce_max = f32(a, Slot::ce_max);
  float* ce_stats = f32(a, Slot::ce_stats);
  const int32_t* targets = static_cast<const int32_t*>(slot(a, 0, Slot::targets));
  // The final norm writes its rows into their place in lnf, gathered there in place.
  ops::Act* lnf_held = ops::advance(lnf, size_t(tp_.first_row()) * C_, dt_);
  final_norm_forward(lnf_held, f32(a, Slot::lnf_mean), f32(a, Slot::lnf_rstd), output(a),
                     tp_.rows_held());
  tp_.gather(lnf_held, lnf, C_);
  // The head: logits[N, Vrows] = lnf[N,C] @ head_shard[Vrows,C]^T.
  ops_.gemm(false, true, N, Vrows_, C_, 1.0f, lnf, weight(head_name()), 0.0f, logits);
  // With a loss scale the cross-entropy also turns the logits into dlogits in place.
  ops::Act* dlogits = loss_scale > 0 ? logits : nullptr;
  const float dloss = loss_scale / float(N);
  if (part_.tp_size == 1) {
    ops_.cross_entropy(losses, dlogits, logits, targets, N, V, Vrows_, dloss);
  } else {  // vocab-parallel: full logits are never gathered
    ops_.ce_row_max(ce_max, ce_stats, logits, N, Vrows_, vocab_begin_, V);
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

// Recomputes what B (and W) of a recomputed layer read and the forward did not keep,
// with the forward's own operations on the same inputs: the same values, bit for bit.
void DecoderModel::recompute(int l, int i, LayerView& v) {
  const Recompute mode = policy_.mode_of(i);
  if (mode == Recompute::Full) {
    LayerView r = v;
    r.out = v.recomputed_out;  // the output is kept: the next layer's input
    layer_forward(l, r);
  } else if (mode == Recompute::Selective) {  // the attention core: its softmax state
    attention_forward(v);
  }
}

void DecoderModel::backward_input(int chunk, Set& set, const LayerFn& layer_done) {
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
    layer_backward_input(l, v, fused);
    if (fused && layer_done) layer_done(l);
  }
  give_back(a, Lifetime::UntilB);
  if (fused) {
    chunk_backward_weight(chunk, a);
    a.weight_done = true;
    give_back(a, Lifetime::FromB);
  }
}

void DecoderModel::head_backward_input(Activations& a) {
  const int N = B_ * T_;
  ops::Act* dlnf = act(a, Slot::dlnf);
  ops::Act* partial = tp_.partial_target(dlnf, act(a, Slot::sp_scratch));
  ops_.gemm(false, false, N, C_, Vrows_, 1.0f, act(a, Slot::logits), weight(head_name()), 0.0f,
            partial);
  tp_.reduce(partial, dlnf, C_);  // the vocab shards' contributions
  ops::Act* dout = output_grad(a);
  ops_.fill_zero(dout, boundary_bytes());
  final_norm_backward_input(dout, dlnf, output(a), f32(a, Slot::lnf_mean), f32(a, Slot::lnf_rstd),
                            tp_.rows_held());
}

void DecoderModel::backward_weight(int chunk, Set& set, const LayerFn& layer_done) {
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

void DecoderModel::chunk_backward_weight(int chunk, Activations& a) {
  const ChunkSpec& c = part_.chunks[size_t(chunk)];
  const int N = B_ * T_;
  if (c.last) {  // dhead += dlogits^T @ lnf; the final norm (its held rows)
    ops_.linear_weight_grad(grad(head_name()), act(a, Slot::logits), act(a, Slot::lnf), N, Vrows_, C_);
    final_norm_backward_weight(act(a, Slot::dlnf), output(a), f32(a, Slot::lnf_mean),
                               f32(a, Slot::lnf_rstd), tp_.rows_held());
  }
  if (!c.first) return;
  // Every rank's token rows: its vocab rows of the embedding, all positions it holds.
  const ops::Act* dx = tp_.gather(input_grad(a), act(a, Slot::sp_scratch), C_);
  const bool whole_sequences = split_.cp == 1;
  ops_.embedding_backward(grad(embedding_name()), whole_sequences ? position_grad() : nullptr, dx,
                          static_cast<const int32_t*>(slot(a, 0, Slot::tokens)), vocab_begin_,
                          Vrows_, B_, T_, C_);
  if (whole_sequences || !position_grad()) return;
  // A piece's rows of every sequence add to the table rows of its positions.
  const int len = split_.piece_len();
  for (int p = 0; p < split_.pieces(); ++p)
    ops_.bias_backward(position_grad() + size_t(split_.first(p)) * C_,
                       ops::advance(dx, size_t(p) * B_ * len * C_, dt_), B_, len * C_);
}

void DecoderModel::row_parallel_residual(bool trans_w, const ops::Act* inp, int width,
                                         const ops::Act* w, const ops::Act* bias,
                                         const ops::Act* residual, ops::Act* out,
                                         ops::Act* partial) {
  const int Nh = tp_.rows_held(), C = C_;
  if (!tp_.sums()) return ops_.gemm_residual(trans_w, Nh, C, width, inp, w, bias, residual, out);
  tp_.reduce_rows(tp_.partial_target(out, partial), out, C, [&](int first, int rows, ops::Act* part) {
    ops_.gemm(false, trans_w, rows, C, width, 1.0f, tp_.row(inp, first, width), w, 0.0f, part);
  });
  if (bias) ops_.add_bias(out, bias, Nh, C);
  ops_.add(out, out, residual, std::size_t(Nh) * std::size_t(C));
}

void DecoderModel::attention_forward(const LayerView& v) {
  if (ring_) return ring_->forward(v.atty, v.att_state, v.qkv);
  ops_.attention_forward(v.atty, v.att_state, v.qkv, B_, T_, NHl_ * hs_, NHl_, NKVl_);
}

void DecoderModel::attention_backward(const LayerView& v, const ops::Act* datty) {
  if (ring_) return ring_->backward(v.dqkv, datty, v.qkv, v.atty, v.att_state);
  ops_.attention_backward(v.dqkv, datty, v.qkv, v.atty, v.att_state, B_, T_, NHl_ * hs_, NHl_,
                          NKVl_);
}

}  // namespace pptrain
