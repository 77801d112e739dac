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
                             std::vector<int64_t> hf_shape) {
  constexpr std::size_t kAlignFloats = kArenaAlignment / sizeof(float);
  ParamEntry e;
  e.name = name;
  e.hf_shape = hf_shape.empty() ? shape : std::move(hf_shape);
  e.shape = std::move(shape);
  e.numel = product(e.shape);
  e.decay = decay;
  e.offset = (total_ + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  total_ = e.offset + e.numel;
  entries_.push_back(std::move(e));
  return entries_.back();
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

ParamLayout gpt_param_layout(const ModelConfig& m, const ModelPartition& part) {
  const int tp = part.tp_size, r = part.tp_rank;
  PPTRAIN_CHECK(tp >= 1 && m.n_head % tp == 0, "tp must divide n_head");
  const int64_t C = m.d_model, V = m.vocab_size, T = m.seq_len, Cl = C / tp;
  ParamLayout layout;
  // Shorthands: a replicated tensor, a tensor split along `dim` into `groups` groups.
  auto whole = [&](const std::string& name, std::vector<int64_t> shape, bool decay) {
    layout.add(name, std::move(shape), decay);
  };
  auto split = [&](const std::string& name, std::vector<int64_t> local,
                   std::vector<int64_t> global, int dim, int groups, bool decay) {
    ParamEntry& e = layout.add(name, std::move(local), decay, std::move(global));
    e.split_dim = tp > 1 ? dim : -1;
    e.split_groups = groups;
    e.shard = r;
    e.num_shards = tp;
  };
  auto norm = [&](const std::string& name) {
    layout.add(name + ".weight", {C}, false).layer_norm = true;
    layout.add(name + ".bias", {C}, false).layer_norm = true;
  };
  auto add_wte = [&](bool copy) {
    ParamEntry& e = layout.add("transformer.wte.weight", {vocab_rows_per_shard(m, tp), C}, true,
                               {V, C});
    e.split_dim = 0;  // vocab-parallel; with tp == 1 only the padding is "outside"
    e.shard = r;
    e.num_shards = tp;
    e.tied_copy = copy;
  };
  const auto end_group = [&] { layout.pad_to(part.group_floats); };
  for (const ChunkSpec& c : part.chunks) {
    if (c.first) {
      add_wte(false);
      whole("transformer.wpe.weight", {T, C}, true);
      end_group();
    }
    for (int l = c.layer_begin; l < c.layer_end; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      norm(h + "ln_1");
      split(h + "attn.c_attn.weight", {C, 3 * Cl}, {C, 3 * C}, 1, 3, true);  // column: q|k|v
      split(h + "attn.c_attn.bias", {3 * Cl}, {3 * C}, 0, 3, false);
      split(h + "attn.c_proj.weight", {Cl, C}, {C, C}, 0, 1, true);  // row-parallel
      whole(h + "attn.c_proj.bias", {C}, false);
      norm(h + "ln_2");
      split(h + "mlp.c_fc.weight", {C, 4 * Cl}, {C, 4 * C}, 1, 1, true);  // column
      split(h + "mlp.c_fc.bias", {4 * Cl}, {4 * C}, 0, 1, false);
      split(h + "mlp.c_proj.weight", {4 * Cl, C}, {4 * C, C}, 0, 1, true);  // row
      whole(h + "mlp.c_proj.bias", {C}, false);
      end_group();
    }
    if (c.last) {
      norm("transformer.ln_f");
      if (!layout.contains("transformer.wte.weight")) add_wte(part.tied_copy_on_last);
      end_group();
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
