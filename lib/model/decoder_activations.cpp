// DecoderModel's activation memory: each chunk's layout from the activation table, the sets,
// the parts lent between passes, the shared workspace, and the views the passes use.
#include <algorithm>
#include <stdexcept>

#include "core/error.hpp"
#include "model/decoder.hpp"

namespace pptrain {

ActivationShape DecoderModel::activation_shape() const {
  ActivationShape s = model_activation_shape(cfg_, B_, part_.tp_size, dtype_size(dt_));
  s.seq_len = T_;  // the positions this rank holds
  // The ring's state is the rows' log-sum-exps, whatever the backend's own attention saves.
  s.attention_state_bytes = split_.cp > 1
                                ? ops::attention_state_bytes(true, dt_, B_, T_, NHl_)
                                : ops_.attention_state_bytes(B_, T_, NHl_);
  return s;
}

void DecoderModel::init_activation_layouts() {
  const ActivationShape shape = activation_shape();
  std::size_t workspace = 0;
  for (const ChunkSpec& c : part_.chunks) {
    const int n = c.layer_end - c.layer_begin;
    layouts_.push_back(chunk_activation_layout(shape, policy_, n, c.first, c.last));
    workspace = std::max(workspace, layouts_.back().part_bytes[int(Lifetime::Workspace)]);
    fused_backward_.push_back(policy_.fused_backward(n));
  }
  workspace_ = ops::Buffer(ops_, workspace, "the activation workspace");
  spare_until_b_.resize(part_.chunks.size());
  spare_from_b_.resize(part_.chunks.size());
}

DecoderModel::Activations& DecoderModel::activations(Set& set) { return static_cast<Activations&>(set); }
const DecoderModel::Activations& DecoderModel::activations(const Set& set) {
  return static_cast<const Activations&>(set);
}

std::unique_ptr<StageModel::Set> DecoderModel::new_set(int chunk) { return new_activations(chunk); }

std::unique_ptr<DecoderModel::Activations> DecoderModel::new_activations(int chunk) const {
  const ChunkActivationLayout& L = layouts_.at(std::size_t(chunk));
  auto a = std::make_unique<Activations>();
  a->chunk = chunk;
  a->set = ops::Buffer(ops_, L.part_bytes[int(Lifetime::Set)], "an activation set");
  if (L.last) a->host_losses.resize(std::size_t(B_) * T_);
  return a;
}

void DecoderModel::lend(Activations& a, Lifetime part) {
  const std::size_t bytes = layouts_[std::size_t(a.chunk)].part_bytes[int(part)];
  ops::Buffer& held = part == Lifetime::UntilB ? a.until_b : a.from_b;
  auto& spare = (part == Lifetime::UntilB ? spare_until_b_ : spare_from_b_)[std::size_t(a.chunk)];
  if (held.get() || bytes == 0) return;
  if (spare.empty()) {
    held = ops::Buffer(ops_, bytes, part == Lifetime::UntilB ? "an activation set's part kept until B"
                                                             : "an activation set's gradient part");
  } else {
    held = std::move(spare.back());
    spare.pop_back();
  }
}

void DecoderModel::give_back(Activations& a, Lifetime part) {
  ops::Buffer& held = part == Lifetime::UntilB ? a.until_b : a.from_b;
  auto& spare = (part == Lifetime::UntilB ? spare_until_b_ : spare_from_b_)[std::size_t(a.chunk)];
  if (held.get()) spare.push_back(std::move(held));
}

void DecoderModel::release_parts(Set& set) {
  Activations& a = activations(set);
  give_back(a, Lifetime::UntilB);
  give_back(a, Lifetime::FromB);
}

namespace {
int boundary_index(Slot s) {
  switch (s) {
    case Slot::output: return 0;
    case Slot::output_grad: return 1;
    case Slot::input_grad: return 2;
    default: throw std::logic_error("not a boundary slot");
  }
}
}  // namespace

ops::Act* DecoderModel::boundary(Activations& a, Slot s) {
  const int i = boundary_index(s);
  if (a.boundaries[i]) return a.boundaries[i];
  if (spare_boundaries_.empty()) {
    a.lent[i] = ops::Buffer(ops_, boundary_bytes(), "a stage-boundary array");
  } else {
    a.lent[i] = std::move(spare_boundaries_.back());
    spare_boundaries_.pop_back();
  }
  return a.boundaries[i] = a.lent[i].act();
}

void DecoderModel::release_boundaries(Set& set) {
  Activations& a = activations(set);
  for (int i = 0; i < 3; ++i) {
    if (a.lent[i].get()) spare_boundaries_.push_back(std::move(a.lent[i]));
    a.boundaries[i] = nullptr;
  }
}

void DecoderModel::return_boundary(Set& set, Slot s) {
  Activations& a = activations(set);
  const int i = boundary_index(s);
  if (a.lent[i].get()) spare_boundaries_.push_back(std::move(a.lent[i]));
  a.boundaries[i] = nullptr;
}

void DecoderModel::output_into(Set& set, ops::Act* next_input) {
  Activations& a = activations(set);
  PPTRAIN_CHECK(!a.boundaries[boundary_index(Slot::output)], "the output is already held");
  a.boundaries[boundary_index(Slot::output)] = next_input;
}

void DecoderModel::input_grad_into(Set& set, ops::Act* previous_output_grad) {
  Activations& a = activations(set);
  PPTRAIN_CHECK(!a.boundaries[boundary_index(Slot::input_grad)], "the input gradient is already held");
  a.boundaries[boundary_index(Slot::input_grad)] = previous_output_grad;
}

// The slot's buffer for layer `local` of the set's chunk (per-chunk slots ignore it). In
// the forward, a fully recomputed layer writes its B..W slots into the workspace.
void* DecoderModel::slot(Activations& a, int local, Slot s, bool forward) const {
  const ChunkActivationLayout& L = layouts_[std::size_t(a.chunk)];
  ChunkActivationLayout::Where w = L.at(local, s);
  if (forward && w.life == Lifetime::FromB && is_layer_slot(s) &&
      activation_entry(s).written_by[0] == 'F')
    w = L.forward_scratch[std::size_t(s)];
  if (w.bytes == 0) return nullptr;
  if (w.life == Lifetime::Boundary) {
    ops::Act* held = a.boundaries[boundary_index(s)];
    PPTRAIN_CHECK(held, std::string("boundary array '") + activation_entry(s).name + "' is not held");
    return held;
  }
  const ops::Buffer* part = nullptr;
  switch (w.life) {
    case Lifetime::Set: part = &a.set; break;
    case Lifetime::UntilB: part = &a.until_b; break;
    case Lifetime::FromB: part = &a.from_b; break;
    case Lifetime::Workspace: part = &workspace_; break;
    case Lifetime::Boundary: break;
  }
  PPTRAIN_CHECK(part->get() != nullptr, std::string("activation part of '") +
                                            activation_entry(s).name + "' is not held");
  return static_cast<std::byte*>(part->get()) + w.offset;
}

DecoderModel::LayerView DecoderModel::layer_view(Activations& a, int i, Pass pass) const {
  const ChunkActivationLayout& L = layouts_[std::size_t(a.chunk)];
  const int n = L.layers;
  const bool forward = pass == Pass::Forward;
  // The forward sees no gradient slots (their part is lent from B on), W none of the
  // slots B alone reads (their part went back when B ended).
  auto visible = [&](Slot s) {
    if (forward) return activation_entry(s).written_by[0] == 'F';
    return pass != Pass::Weight || L.at(i, s).life != Lifetime::UntilB;
  };
  auto A = [&](Slot s) {
    return visible(s) ? static_cast<ops::Act*>(slot(a, i, s, forward)) : nullptr;
  };
  auto F = [&](Slot s) { return static_cast<float*>(slot(a, i, s, forward)); };
  LayerView v{};
  v.x = A(Slot::x);
  if (forward)  // B's recomputation writes its own copy (recomputed_out)
    v.out = i + 1 < n ? static_cast<ops::Act*>(slot(a, i + 1, Slot::x)) : act(a, Slot::output);
  if (!forward) {
    v.dx = i == 0 ? act(a, Slot::input_grad) : A(Slot::dx);
    v.dout = i + 1 < n ? static_cast<ops::Act*>(slot(a, i + 1, Slot::dx)) : act(a, Slot::output_grad);
  }
  v.ln1 = A(Slot::ln1);
  v.ln1_gathered = A(Slot::ln1_gathered);
  v.qkv = A(Slot::qkv);
  v.atty = A(Slot::atty);
  v.partial = A(Slot::partial);
  v.res2 = A(Slot::res2);
  v.ln2 = A(Slot::ln2);
  v.ln2_gathered = A(Slot::ln2_gathered);
  v.fch = A(Slot::fch);
  v.fch_gelu = A(Slot::fch_gelu);
  v.dout_gathered = A(Slot::dout_gathered);
  v.dres2 = A(Slot::dres2);
  v.dres2_gathered = A(Slot::dres2_gathered);
  v.dfch_act = A(Slot::dfch_act);
  v.dfch = A(Slot::dfch);
  v.dln2 = A(Slot::dln2);
  v.dqkv = A(Slot::dqkv);
  v.dln1 = A(Slot::dln1);
  v.recomputed_out = A(Slot::recomputed_out);
  v.ln1_mean = F(Slot::ln1_mean);
  v.ln1_rstd = F(Slot::ln1_rstd);
  v.ln2_mean = F(Slot::ln2_mean);
  v.ln2_rstd = F(Slot::ln2_rstd);
  v.att_state = visible(Slot::att_state) ? slot(a, i, Slot::att_state, forward) : nullptr;
  return v;
}

std::size_t DecoderModel::boundary_bytes() const {
  return activation_layout(0).part_bytes[int(Lifetime::Boundary)];
}

// Split by elements: C, and so every boundary array, is a multiple of tp.
bool DecoderModel::scatters_messages() const { return part_.tp_size > 1 && !tp_.sequence_parallel(); }

std::pair<std::size_t, std::size_t> DecoderModel::message_part() const {
  if (!scatters_messages()) return {0, boundary_bytes()};
  const std::size_t share = boundary_bytes() / std::size_t(part_.tp_size);
  return {share * std::size_t(part_.tp_rank), share};
}

void DecoderModel::complete_message(ops::Act* boundary) {
  if (!scatters_messages()) return;
  const std::size_t count = boundary_bytes() / dtype_size(dt_) / std::size_t(part_.tp_size);
  tp_.all_gather_in_place(boundary, count);
}

ops::Act* DecoderModel::input_buffer(Set& set) const {
  return static_cast<ops::Act*>(slot(activations(set), 0, Slot::x));
}
ops::Act* DecoderModel::output(Set& set) { return boundary(activations(set), Slot::output); }
ops::Act* DecoderModel::output_grad(Set& set) { return boundary(activations(set), Slot::output_grad); }
ops::Act* DecoderModel::input_grad(Set& set) { return boundary(activations(set), Slot::input_grad); }

}  // namespace pptrain
