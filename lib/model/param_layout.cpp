#include "model/param_layout.hpp"

#include <stdexcept>

#include "core/aligned_buffer.hpp"

namespace pptrain {

namespace {
std::size_t product(const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}
}  // namespace

std::size_t ParamEntry::hf_numel() const { return product(hf_shape); }

void ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool decay,
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
}

const ParamEntry& ParamLayout::at(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  throw std::out_of_range("no parameter named " + name);
}

int64_t ParamLayout::hf_param_count() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += static_cast<int64_t>(e.hf_numel());
  return n;
}

ParamLayout gpt_param_layout(const ModelConfig& m) {
  const int64_t C = m.d_model, V = m.vocab_size, Vp = padded_vocab(m), T = m.seq_len;
  ParamLayout layout;
  layout.add("transformer.wte.weight", {Vp, C}, true, {V, C});  // (vocab, C), tied LM head
  layout.add("transformer.wpe.weight", {T, C}, true);           // (seq_len, C)
  for (int l = 0; l < m.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    layout.add(h + "ln_1.weight", {C}, false);
    layout.add(h + "ln_1.bias", {C}, false);
    layout.add(h + "attn.c_attn.weight", {C, 3 * C}, true);  // (in, out): q|k|v
    layout.add(h + "attn.c_attn.bias", {3 * C}, false);
    layout.add(h + "attn.c_proj.weight", {C, C}, true);
    layout.add(h + "attn.c_proj.bias", {C}, false);
    layout.add(h + "ln_2.weight", {C}, false);
    layout.add(h + "ln_2.bias", {C}, false);
    layout.add(h + "mlp.c_fc.weight", {C, 4 * C}, true);
    layout.add(h + "mlp.c_fc.bias", {4 * C}, false);
    layout.add(h + "mlp.c_proj.weight", {4 * C, C}, true);
    layout.add(h + "mlp.c_proj.bias", {C}, false);
  }
  layout.add("transformer.ln_f.weight", {C}, false);
  layout.add("transformer.ln_f.bias", {C}, false);
  return layout;
}

}  // namespace pptrain
