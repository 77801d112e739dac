// The activation table: one row per buffer, and the rules that place each buffer.
#include "model/activation_table.hpp"

#include <fmt/format.h>

#include "model/param_layout.hpp"

#include <algorithm>
#include <stdexcept>


namespace pptrain {

const char* lifetime_name(Lifetime life) {
  switch (life) {
    case Lifetime::Set: return "kept F..W";
    case Lifetime::UntilB: return "F..B";
    case Lifetime::FromB: return "B..W";
    case Lifetime::Workspace: return "workspace";
    case Lifetime::Boundary: return "boundary, lent";
  }
  return "?";
}

namespace {
// How a row of the table is sized: rows (N = batch * seq_len tokens, N/tp when sequence
// sharded under SP) times a width in elements of a type.
enum class Width { C, Cl, Qkv, Fc, FcAct, GatedAct, Vrows, One, Mean, Two, AttentionState };
enum class Elem { Act, F32, I32 };

struct Row {
  ActivationEntry entry;
  Width width;
  Elem elem;
  bool sp_only;    // exists only under sequence parallelism
  bool full_only;  // exists only for fully recomputed layers
};

// clang-format off
const Row kRows[] = {
  // slot                     name              shape                 by      B      W      seq-sharded
  {{Slot::x,              "x",              "N x C",              "F",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::ln1,            "ln1",            "N x C",              "F",    false, true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::ln1_mean,       "ln1_mean",       "N fp32",             "F",    true,  true,  true }, Width::Mean, Elem::F32, false, false},
  {{Slot::ln1_rstd,       "ln1_rstd",       "N fp32",             "F",    true,  true,  true }, Width::One, Elem::F32, false, false},
  {{Slot::ln1_gathered,   "ln1_gathered",   "N x C (SP)",         "F",    false, false, false}, Width::C,   Elem::Act, true,  false},
  {{Slot::qkv,            "qkv",            "N x 3C/t",           "F",    true,  false, false}, Width::Qkv, Elem::Act, false, false},
  {{Slot::att_state,      "att_state",      "softmax state",      "F",    true,  false, false}, Width::AttentionState, Elem::Act, false, false},
  {{Slot::atty,           "atty",           "N x C/t",            "F",    true,  true,  false}, Width::Cl,  Elem::Act, false, false},
  {{Slot::partial,        "partial",        "N x C (SP)",         "F",    false, false, false}, Width::C,   Elem::Act, true,  false},
  {{Slot::res2,           "res2",           "N x C",              "F",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::ln2,            "ln2",            "N x C",              "F",    false, true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::ln2_mean,       "ln2_mean",       "N fp32",             "F",    true,  true,  true }, Width::Mean, Elem::F32, false, false},
  {{Slot::ln2_rstd,       "ln2_rstd",       "N fp32",             "F",    true,  true,  true }, Width::One, Elem::F32, false, false},
  {{Slot::ln2_gathered,   "ln2_gathered",   "N x C (SP)",         "F",    false, false, false}, Width::C,   Elem::Act, true,  false},
  {{Slot::fch,            "fch",            "N x 4C/t",           "F",    true,  false, false}, Width::Fc, Elem::Act, false, false},
  {{Slot::fch_gelu,       "fch_gelu",       "N x 4C/t",           "F",    false, true,  false}, Width::FcAct, Elem::Act, false, false},
  {{Slot::dout_gathered,  "dout_gathered",  "N x C (SP)",         "B",    true,  true,  false}, Width::C,   Elem::Act, true,  false},
  {{Slot::dres2,          "dres2",          "N x C",              "B",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::dres2_gathered, "dres2_gathered", "N x C (SP)",         "B",    true,  true,  false}, Width::C,   Elem::Act, true,  false},
  {{Slot::dfch_act,       "dfch_act",       "N x F/t (gated)",    "B",    true,  false, false}, Width::GatedAct, Elem::Act, false, false},
  {{Slot::dfch,           "dfch",           "N x 4C/t",           "B",    false, true,  false}, Width::Fc, Elem::Act, false, false},
  {{Slot::dln2,           "dln2",           "N x C",              "B",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::dqkv,           "dqkv",           "N x 3C/t",           "B",    false, true,  false}, Width::Qkv, Elem::Act, false, false},
  {{Slot::dln1,           "dln1",           "N x C",              "B",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::dx,             "dx",             "N x C (layers > 0)", "B",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::recomputed_out, "recomputed_out", "N x C (full)",       "B",    false, false, true }, Width::C,   Elem::Act, false, true },
  {{Slot::tokens,         "tokens",         "N int32 (first)",    "F",    false, true,  false}, Width::One, Elem::I32, false, false},
  {{Slot::targets,        "targets",        "N int32 (last)",     "F",    false, false, false}, Width::One, Elem::I32, false, false},
  {{Slot::output,         "output",         "N x C",              "F",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::output_grad,    "output_grad",    "N x C",              "recv", true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::input_grad,     "input_grad",     "N x C",              "B",    false, true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::sp_scratch,     "sp_scratch",     "N x C (SP)",         "F",    false, false, false}, Width::C,   Elem::Act, true,  false},
  {{Slot::lnf,            "lnf",            "N x C (last)",       "F",    false, true,  false}, Width::C,   Elem::Act, false, false},
  {{Slot::lnf_mean,       "lnf_mean",       "N fp32 (last)",      "F",    true,  true,  true }, Width::Mean, Elem::F32, false, false},
  {{Slot::lnf_rstd,       "lnf_rstd",       "N fp32 (last)",      "F",    true,  true,  true }, Width::One, Elem::F32, false, false},
  {{Slot::logits,         "logits",         "N x Vp/t (last)",    "F",    true,  true,  false}, Width::Vrows, Elem::Act, false, false},
  {{Slot::losses,         "losses",         "N fp32 (last)",      "F",    false, false, false}, Width::One, Elem::F32, false, false},
  {{Slot::dlnf,           "dlnf",           "N x C (last)",       "B",    true,  true,  true }, Width::C,   Elem::Act, false, false},
  {{Slot::ce_max,         "ce_max",         "N fp32 (last)",      "F",    false, false, false}, Width::One, Elem::F32, false, false},
  {{Slot::ce_stats,       "ce_stats",       "2N fp32 (last)",     "F",    false, false, false}, Width::Two, Elem::F32, false, false},
};
// clang-format on
static_assert(sizeof(kRows) / sizeof(kRows[0]) == kSlots, "one row per slot");

const Row& row(Slot s) {
  const Row& r = kRows[int(s)];
  if (r.entry.slot != s) throw std::logic_error("activation table out of slot order");
  return r;
}

bool head_slot(Slot s) { return int(s) >= int(Slot::lnf); }

// Scratch, written and read inside one pass (one layer of it for layer slots): one copy
// per model.
bool scratch(Slot s) {
  switch (s) {
    case Slot::ln1_gathered: case Slot::ln2_gathered: case Slot::partial: case Slot::dfch_act:
    case Slot::recomputed_out: case Slot::sp_scratch: case Slot::targets:
    case Slot::losses: case Slot::ce_max: case Slot::ce_stats:
      return true;
    default:
      return false;
  }
}
}  // namespace

const std::vector<ActivationEntry>& activation_entries() {
  static const std::vector<ActivationEntry> entries = [] {
    std::vector<ActivationEntry> e;
    for (const Row& r : kRows) e.push_back(r.entry);
    return e;
  }();
  return entries;
}

const ActivationEntry& activation_entry(Slot slot) { return row(slot).entry; }

ActivationShape model_activation_shape(const ModelConfig& m, int batch, int tp,
                                       std::size_t act_bytes) {
  ActivationShape s;
  s.batch = batch;
  s.seq_len = m.seq_len;
  s.d_model = m.d_model;
  s.heads = m.n_head / tp;
  s.kv_heads = kv_heads(m) / tp;
  s.ffn = ffn_width(m);
  s.gated = s.norm_mean = false;
  if (m.arch == Arch::Gpt2) s.norm_mean = true;
  else s.gated = true;
  s.tp = tp;
  s.vocab_rows = vocab_rows_per_shard(m, tp);
  s.act_bytes = act_bytes;
  return s;
}

namespace {
// A row's size in words for `shape`: GPT-2's as the table says it, a llama block's
// (grouped k/v, gate|up) rewritten.
std::string shape_text(const ActivationEntry& e, const ActivationShape& shape) {
  std::string text = e.shape;
  if (!shape.gated) return text;
  const auto swap = [&](const std::string& from, const std::string& to) {
    if (auto at = text.find(from); at != std::string::npos) text.replace(at, from.size(), to);
  };
  swap("3C/t", "(C+2Ckv)/t");
  swap("4C/t", e.slot == Slot::fch_gelu ? "F/t" : "2F/t");
  return text;
}
}  // namespace

std::size_t slot_bytes(Slot slot, const ActivationShape& s, const ActivationPolicy& policy,
                       bool first_chunk, bool last_chunk) {
  const Row& r = row(slot);
  if (r.sp_only && !policy.sequence_parallel) return 0;
  if (head_slot(slot) && !last_chunk) return 0;
  if (slot == Slot::targets && !last_chunk) return 0;
  if (slot == Slot::tokens && !first_chunk) return 0;
  if (r.width == Width::AttentionState) return s.attention_state_bytes;
  std::size_t rows = std::size_t(s.batch) * s.seq_len;
  if (r.entry.sequence_sharded && policy.sequence_parallel) rows /= std::size_t(s.tp);
  const std::size_t C = std::size_t(s.d_model), Cl = C / std::size_t(s.tp);
  const std::size_t hs = Cl / std::size_t(s.heads);
  const std::size_t kv = std::size_t(s.kv_heads > 0 ? s.kv_heads : s.heads);
  const std::size_t F = (s.ffn > 0 ? std::size_t(s.ffn) : 4 * C) / std::size_t(s.tp);
  std::size_t width = 1;
  switch (r.width) {
    case Width::C: width = C; break;
    case Width::Cl: width = Cl; break;
    case Width::Qkv: width = Cl + 2 * kv * hs; break;
    case Width::Fc: width = s.gated ? 2 * F : F; break;
    case Width::FcAct: width = F; break;
    case Width::GatedAct: width = s.gated ? F : 0; break;
    case Width::Vrows: width = std::size_t(s.vocab_rows); break;
    case Width::One: width = 1; break;
    case Width::Mean: width = s.norm_mean ? 1 : 0; break;
    case Width::Two: width = 2; break;
    case Width::AttentionState: break;
  }
  const std::size_t elem = r.elem == Elem::Act ? s.act_bytes : 4;
  return rows * width * elem;
}

Lifetime slot_lifetime(Slot slot, Recompute mode, const ActivationPolicy& policy) {
  const ActivationEntry& e = row(slot).entry;
  if (scratch(slot)) return Lifetime::Workspace;
  if (slot == Slot::output || slot == Slot::output_grad || slot == Slot::input_grad)
    return Lifetime::Boundary;
  if (slot == Slot::x || slot == Slot::tokens) return Lifetime::Set;  // the recomputation's checkpoint
  const bool fused = mode == Recompute::Full && policy.weight_follows_input;
  if (e.written_by[0] == 'B') return fused && slot != Slot::dx ? Lifetime::Workspace : Lifetime::FromB;
  if (mode == Recompute::Full) return e.read_by_w && !fused ? Lifetime::FromB : Lifetime::Workspace;
  if (mode == Recompute::Selective && slot == Slot::att_state) return Lifetime::Workspace;
  return e.read_by_w ? Lifetime::Set : Lifetime::UntilB;
}

ChunkActivationLayout chunk_activation_layout(const ActivationShape& shape,
                                              const ActivationPolicy& policy, int layers,
                                              bool first, bool last) {
  constexpr std::size_t kAlign = 256;
  ChunkActivationLayout out;
  out.layers = layers;
  out.first = first;
  out.last = last;
  auto place = [&](std::size_t bytes, Lifetime life) {
    std::size_t& end = out.part_bytes[int(life)];
    if (life == Lifetime::Boundary) {  // a buffer of its own
      end = std::max(end, bytes);
      return ChunkActivationLayout::Where{life, 0, bytes};
    }
    const ChunkActivationLayout::Where w{life, end, bytes};
    end += (bytes + kAlign - 1) / kAlign * kAlign;
    return w;
  };
  // Workspace slots of layers are shared: every layer's copy is at the same offset.
  std::vector<ChunkActivationLayout::Where> shared(kLayerSlots, {Lifetime::Workspace, 0, 0});
  std::vector<bool> shared_placed(kLayerSlots, false);
  for (int l = 0; l < layers; ++l) {
    const Recompute mode = policy.mode_of(l);
    for (int k = 0; k < kLayerSlots; ++k) {
      const Slot s = Slot(k);
      std::size_t bytes = slot_bytes(s, shape, policy, first, last);
      if (s == Slot::dx && l == 0) bytes = 0;  // layer 0's input gradient is input_grad
      if (row(s).full_only && mode != Recompute::Full) bytes = 0;
      const Lifetime life = slot_lifetime(s, mode, policy);
      if (life == Lifetime::Workspace || (life == Lifetime::FromB && row(s).entry.written_by[0] == 'F')) {
        // The forward of a recomputed layer writes these into the workspace too.
        if (!shared_placed[size_t(k)] || shared[size_t(k)].bytes < bytes) {
          if (bytes > 0) shared[size_t(k)] = place(bytes, Lifetime::Workspace);
          shared_placed[size_t(k)] = bytes > 0;
        }
      }
      out.layer_slots.push_back(life == Lifetime::Workspace ? ChunkActivationLayout::Where{life, 0, bytes}
                                                           : place(bytes, life));
    }
  }
  // Point the workspace rows at their shared copy; remember the shared copy of the
  // forward-written B..W rows in the Workspace part too (see GptModel::view).
  out.forward_scratch.assign(kLayerSlots, {Lifetime::Workspace, 0, 0});
  for (int k = 0; k < kLayerSlots; ++k) out.forward_scratch[size_t(k)] = shared[size_t(k)];
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kLayerSlots; ++k) {
      auto& w = out.layer_slots[size_t(l) * kLayerSlots + size_t(k)];
      if (w.life == Lifetime::Workspace) w.offset = shared[size_t(k)].offset;
    }
  for (int k = kLayerSlots; k < kSlots; ++k) {
    const Slot s = Slot(k);
    out.chunk_slots.push_back(place(slot_bytes(s, shape, policy, first, last),
                                    slot_lifetime(s, Recompute::None, policy)));
  }
  return out;
}

std::string describe_activation_table(const ActivationShape& shape, const ActivationPolicy& policy) {
  std::string out = fmt::format("  {:<18}{:<20}{:<7}{:<6}{:>14}  {}\n", "buffer", "size", "by",
                                "read", "bytes", "lifetime (first layer of a chunk)");
  for (const Row& r : kRows) {
    const ActivationEntry& e = r.entry;
    const std::size_t bytes = slot_bytes(e.slot, shape, policy, true, true);
    if (bytes == 0 || (r.full_only && policy.mode_of(0) != Recompute::Full)) continue;
    const std::string read = std::string(e.read_by_b ? "B" : "") + (e.read_by_w ? "W" : "");
    const Recompute mode = is_layer_slot(e.slot) ? policy.mode_of(0) : Recompute::None;
    // Under SP a sharded buffer holds N/t rows: "N x C" reads "N/t x C".
    std::string size = shape_text(e, shape);
    if (policy.sequence_parallel && e.sequence_sharded) size.insert(1, "/t");
    out += fmt::format("  {:<18}{:<20}{:<7}{:<6}{:>14}  {}\n", e.name, size, e.written_by,
                       read.empty() ? "-" : read, bytes, lifetime_name(slot_lifetime(e.slot, mode, policy)));
  }
  return out;
}

}  // namespace pptrain
