// GPT-2 parameter initialisation, layout-independent: each element's value is a
// function of (seed, tensor name, element index in the global GPT-2 tensor), so every
// tensor-parallel shard and pipeline stage draws exactly its slice of the same model.
#include <cmath>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "model/gpt.hpp"

namespace pptrain {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void GptModel::init_parameters(uint64_t seed) {
  std::vector<float> host(layout_.total_floats(), 0.0f);  // built here, then uploaded
  const double residual_std = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  for (const ParamEntry& e : layout_.entries()) {
    float* p = host.data() + e.offset;
    if (ends_with(e.name, ".bias")) continue;  // biases 0
    if (e.name.find("ln_") != std::string::npos) {  // LayerNorm weight 1
      for (size_t i = 0; i < e.numel; ++i) p[i] = 1.0f;
      continue;
    }
    const bool residual_proj = ends_with(e.name, "c_proj.weight");
    const double stddev = residual_proj ? residual_std : 0.02;
    const uint64_t stream = hash_words(seed, hash_string(e.name));
    // Padded vocab rows stay 0.
    fill_from_global(
        e, [&](int64_t i) { return float(stddev * standard_normal(hash_words(stream, uint64_t(i)))); },
        p);
  }
  write_params(host.data());
}

}  // namespace pptrain
