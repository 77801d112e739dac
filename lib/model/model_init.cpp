// Parameter initialisation, layout-independent: each element's value is a function of
// (seed, tensor name, element index in the global tensor), so every tensor-parallel
// shard and pipeline stage draws exactly its slice of the same model. GPT-2: N(0, 0.02)
// for weights and embeddings, residual output projections N(0, 0.02/sqrt(2*n_layer)),
// LayerNorm weight 1, biases 0. Llama (Hugging Face's _init_weights): N(0, 0.02) for
// every linear and embedding, norm weights 1. Padded vocab rows 0.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "model/decoder.hpp"

namespace pptrain {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void DecoderModel::init_parameters(uint64_t seed) {
  // Host-memory backends are filled in place; a device backend gets a host staging copy.
  const bool in_place = !ops_.device_memory() && params_.get();
  std::vector<float> staging(in_place ? 0 : layout_.total_floats());
  float* host = in_place ? params_.f32() : staging.data();
  initial_parameters(seed, host);
  if (in_place)
    refresh_weights();
  else
    write_params(host);
}

void DecoderModel::initial_parameters(uint64_t seed, float* host) const {
  const double residual_std = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  for (const ParamEntry& e : layout_.entries()) {
    float* p = host + e.offset;
    const bool bias = ends_with(e.name, ".bias");
    if (bias || e.layer_norm) {  // biases 0, norm weights 1
      std::fill(p, p + e.numel, bias ? 0.0f : 1.0f);
      continue;
    }
    const bool residual_proj = cfg_.arch == Arch::Gpt2 && ends_with(e.name, "c_proj.weight");
    const double stddev = residual_proj ? residual_std : 0.02;
    const uint64_t stream = hash_words(seed, hash_string(e.name));
    // Padded vocab rows stay 0. Filled by OpenMP threads, a run of elements at a time
    // (each value is a pure function of its index).
    fill_runs_from_global(
        e, [&](int64_t first, int64_t count, float* out) { fill_standard_normal(stream, uint64_t(first), std::size_t(count), stddev, out); },
        p);
  }
}

}  // namespace pptrain
