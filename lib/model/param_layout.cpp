#include "model/param_layout.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"

namespace pptrain {

namespace {
std::size_t product(const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}
}  // namespace

std::size_t ParamEntry::hf_numel() const { return product(hf_shape); }

ParamEntry& ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool decay,
                             std::vector<int64_t> hf_shape, bool packed) {
  constexpr std::size_t kAlignFloats = kArenaAlignment / sizeof(float);
  ParamEntry e;
  e.name = name;
  e.hf_shape = hf_shape.empty() ? shape : std::move(hf_shape);
  e.shape = std::move(shape);
  e.numel = product(e.shape);
  e.decay = decay;
  e.offset = packed ? total_ : (total_ + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  total_ = e.offset + e.numel;
  entries_.push_back(std::move(e));
  return entries_.back();
}

void ParamLayout::begin_group(int chunk, int layer) {
  constexpr std::size_t kAlignFloats = kArenaAlignment / sizeof(float);
  groups_.push_back({chunk, layer, (total_ + kAlignFloats - 1) / kAlignFloats * kAlignFloats});
}

void ParamLayout::pad_to(std::size_t floats) {
  PPTRAIN_CHECK(floats >= 1, "pad_to: floats must be >= 1");
  total_ = (total_ + floats - 1) / floats * floats;
}

const ParamEntry& ParamLayout::at(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  throw std::out_of_range("no parameter named " + name);
}

bool ParamLayout::contains(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return true;
  return false;
}

int64_t ParamLayout::hf_param_count() const {
  int64_t n = 0;
  for (const auto& e : entries_)
    if (!e.tied_copy) n += static_cast<int64_t>(e.hf_numel()) / e.num_shards;
  return n;
}

ModelPartition whole_model(const ModelConfig& model) {
  ModelPartition p;
  p.chunks.push_back({0, model.n_layer, true, true});
  return p;
}

int vocab_rows_per_shard(const ModelConfig& m, int tp_size) {
  return padded_vocab(m, 128 * tp_size) / tp_size;
}

std::string layer_prefix(Arch arch, int layer) {
  return (arch == Arch::Gpt2 ? "transformer.h." : "model.layers.") + std::to_string(layer) + ".";
}

const std::string& embedding_name(Arch arch) {
  static const std::string gpt = "transformer.wte.weight", llama = "model.embed_tokens.weight";
  return arch == Arch::Gpt2 ? gpt : llama;
}

double flops_per_token(const ModelConfig& m) {
  const double L = m.n_layer, C = m.d_model, T = m.seq_len, Vp = padded_vocab(m);
  const double Ckv = double(kv_heads(m)) * head_size(m), F = ffn_width(m);
  const double attention = C * (C + 2 * Ckv) + C * C;   // q|k|v and the output projection
  const double mlp = (m.arch == Arch::Llama ? 3 : 2) * C * F;
  return 6.0 * (L * (attention + mlp) + C * Vp) + 12.0 * L * T * C;
}

namespace {

// Adds the tensors of one arch to a layout for the shard `part` holds; groups and the
// ZeRO group padding are the caller's.
class LayoutBuilder {
 public:
  LayoutBuilder(ParamLayout& layout, const ModelConfig& m, const ModelPartition& part)
      : layout_(layout), m_(m), part_(part), tp_(part.tp_size) {}

  // A replicated tensor.
  ParamEntry& whole(const std::string& name, std::vector<int64_t> shape, bool decay) {
    return layout_.add(name, std::move(shape), decay);
  }
  // A tensor whose global shape is `global`, split along `dim` into `groups` groups.
  ParamEntry& split(const std::string& name, std::vector<int64_t> global, int dim, int groups,
                    bool decay, bool packed = false) {
    std::vector<int64_t> local = global;
    local[std::size_t(dim)] /= tp_;
    ParamEntry& e = layout_.add(name, std::move(local), decay, std::move(global), packed);
    e.split_dim = tp_ > 1 ? dim : -1;
    e.split_groups = groups;
    e.shard = part_.tp_rank;
    e.num_shards = tp_;
    return e;
  }
  ParamEntry& norm(const std::string& name) {
    ParamEntry& e = whole(name, {m_.d_model}, false);
    e.layer_norm = true;
    return e;
  }
  // A vocab-parallel table [V, C] (with tp == 1 only the padding rows are "outside").
  ParamEntry& vocab(const std::string& name, bool copy) {
    ParamEntry& e = layout_.add(name, {vocab_rows_per_shard(m_, tp_), m_.d_model}, true,
                                {m_.vocab_size, m_.d_model});
    e.split_dim = 0;
    e.shard = part_.tp_rank;
    e.num_shards = tp_;
    e.tied_copy = copy;
    return e;
  }

 private:
  ParamLayout& layout_;
  const ModelConfig& m_;
  const ModelPartition& part_;
  int tp_;
};

void add_gpt_layer(LayoutBuilder& b, const ModelConfig& m, const std::string& h) {
  const int64_t C = m.d_model;
  b.norm(h + "ln_1.weight");
  b.norm(h + "ln_1.bias");
  b.split(h + "attn.c_attn.weight", {C, 3 * C}, 1, 3, true);  // column-parallel: q|k|v
  b.split(h + "attn.c_attn.bias", {3 * C}, 0, 3, false);
  b.split(h + "attn.c_proj.weight", {C, C}, 0, 1, true);  // row-parallel
  b.whole(h + "attn.c_proj.bias", {C}, false);
  b.norm(h + "ln_2.weight");
  b.norm(h + "ln_2.bias");
  b.split(h + "mlp.c_fc.weight", {C, 4 * C}, 1, 1, true);  // column
  b.split(h + "mlp.c_fc.bias", {4 * C}, 0, 1, false);
  b.split(h + "mlp.c_proj.weight", {4 * C, C}, 0, 1, true);  // row
  b.whole(h + "mlp.c_proj.bias", {C}, false);
}

// q, k and v packed (one product makes q|k|v), and gate, up packed (gate|up).
void add_llama_layer(LayoutBuilder& b, const ModelConfig& m, const std::string& h) {
  const int64_t C = m.d_model, Ckv = int64_t(kv_heads(m)) * head_size(m), F = ffn_width(m);
  b.norm(h + "input_layernorm.weight");
  b.split(h + "self_attn.q_proj.weight", {C, C}, 0, 1, true);  // column: query heads
  b.split(h + "self_attn.k_proj.weight", {Ckv, C}, 0, 1, true, true);  // key/value heads
  b.split(h + "self_attn.v_proj.weight", {Ckv, C}, 0, 1, true, true);
  b.split(h + "self_attn.o_proj.weight", {C, C}, 1, 1, true);  // row: its input columns
  b.norm(h + "post_attention_layernorm.weight");
  b.split(h + "mlp.gate_proj.weight", {F, C}, 0, 1, true);  // column
  b.split(h + "mlp.up_proj.weight", {F, C}, 0, 1, true, true);
  b.split(h + "mlp.down_proj.weight", {C, F}, 1, 1, true);  // row
}

}  // namespace

ParamLayout param_layout(const ModelConfig& m, const ModelPartition& part) {
  const int tp = part.tp_size;
  PPTRAIN_CHECK(tp >= 1 && m.n_head % tp == 0 && kv_heads(m) % tp == 0 && ffn_width(m) % tp == 0,
                "tp must divide n_head, n_kv_head and ffn_hidden");
  const bool gpt = m.arch == Arch::Gpt2;
  ParamLayout layout;
  LayoutBuilder b(layout, m, part);
  const std::string& embedding = embedding_name(m.arch);
  for (int c = 0; c < int(part.chunks.size()); ++c) {
    const ChunkSpec& spec = part.chunks[std::size_t(c)];
    if (spec.first) {
      layout.begin_group(c, -1);
      b.vocab(embedding, false);
      if (gpt) b.whole("transformer.wpe.weight", {m.seq_len, m.d_model}, true);
      layout.pad_to(part.group_floats);
    }
    for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
      layout.begin_group(c, l);
      if (gpt) add_gpt_layer(b, m, layer_prefix(m.arch, l));
      else add_llama_layer(b, m, layer_prefix(m.arch, l));
      layout.pad_to(part.group_floats);
    }
    if (spec.last) {
      layout.begin_group(c, -1);
      if (gpt) {
        b.norm("transformer.ln_f.weight");
        b.norm("transformer.ln_f.bias");
      } else {
        b.norm("model.norm.weight");
      }
      if (!m.tie_embeddings) b.vocab("lm_head.weight", false);
      else if (!layout.contains(embedding)) b.vocab(embedding, part.tied_copy_on_last);
      layout.pad_to(part.group_floats);
    }
  }
  return layout;
}

namespace {
// Walks the local slice of `e` as runs of elements contiguous in both the local and the
// global tensor, calling f(local_index, global_index, count) from OpenMP threads, with
// global_index -1 for a run of padding; f must write only its run. Runs are at most
// kMaxRun long, so one large tensor still spreads over the threads.
template <typename F>
void for_each_slice_run(const ParamEntry& e, F f) {
  constexpr int64_t kMaxRun = 1 << 14;
  struct Run {
    int64_t local, global, count;
  };
  std::vector<Run> runs;
  auto add = [&](int64_t local, int64_t global, int64_t count) {
    for (int64_t k = 0; k < count; k += kMaxRun)
      runs.push_back({local + k, global < 0 ? -1 : global + k, std::min(kMaxRun, count - k)});
  };
  if (e.split_dim < 0) {
    add(0, 0, int64_t(e.numel));
  } else {
    const int d = e.split_dim;
    // View both tensors as [outer, extent along d, inner]; along d the local tensor is
    // split_groups groups, each a contiguous slice of its padded global group.
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < d; ++k) outer *= e.shape[k];
    for (std::size_t k = d + 1; k < e.shape.size(); ++k) inner *= e.shape[k];
    const int64_t local_extent = e.shape[d], global_extent = e.hf_shape[d];
    const int64_t group_local = local_extent / e.split_groups;
    const int64_t group_global = group_local * e.num_shards;  // padded group size
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t g = 0; g < e.split_groups; ++g) {
        const int64_t j = g * group_local;
        const int64_t global_j = g * group_global + int64_t(e.shard) * group_local;
        const int64_t real = std::clamp<int64_t>(global_extent - global_j, 0, group_local);
        const int64_t local = (o * local_extent + j) * inner;
        add(local, (o * global_extent + global_j) * inner, real * inner);
        add(local + real * inner, -1, (group_local - real) * inner);
      }
  }
  const int64_t n = int64_t(runs.size());
#pragma omp parallel for schedule(dynamic) if (int64_t(e.numel) > (1 << 16))
  for (int64_t r = 0; r < n; ++r) f(runs[r].local, runs[r].global, runs[r].count);
}
}  // namespace

void slice_from_global(const ParamEntry& e, const float* global, float* local) {
  for_each_slice_run(e, [&](int64_t li, int64_t gi, int64_t n) {
    if (gi >= 0)
      std::copy(global + gi, global + gi + n, local + li);
    else
      std::fill(local + li, local + li + n, 0.0f);
  });
}

void fill_from_global(const ParamEntry& e, const std::function<float(int64_t)>& value,
                      float* local) {
  for_each_slice_run(e, [&](int64_t li, int64_t gi, int64_t n) {
    for (int64_t k = 0; k < n; ++k) local[li + k] = gi >= 0 ? value(gi + k) : 0.0f;
  });
}

void fill_runs_from_global(const ParamEntry& e,
                           const std::function<void(int64_t, int64_t, float*)>& values,
                           float* local) {
  for_each_slice_run(e, [&](int64_t li, int64_t gi, int64_t n) {
    if (gi >= 0)
      values(gi, n, local + li);
    else
      std::fill(local + li, local + li + n, 0.0f);
  });
}

void slice_to_global(const ParamEntry& e, const float* local, float* global) {
  for_each_slice_run(e, [&](int64_t li, int64_t gi, int64_t n) {
    if (gi >= 0) std::copy(local + li, local + li + n, global + gi);
  });
}

}  // namespace pptrain
