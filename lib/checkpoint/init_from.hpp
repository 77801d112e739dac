// checkpoint.init_from: a fresh run's weights from a Hugging Face GPT-2 or Llama model
// (a directory holding model.safetensors, or the file), in any layout.
#pragma once
#include <string>
#include <vector>

#include "model/param_layout.hpp"

namespace pptrain {

// Fills this rank's slices of every `layout` entry (host memory, layout.total_floats()
// floats; padding rows 0) from the file, reading only the elements it holds. Tensor
// names are the arch's (GPT-2's with or without the "transformer." prefix); the
// attention mask buffers (attn.bias, attn.masked_bias), rotary frequencies and a tied
// lm_head.weight are ignored. A Llama directory's config.json must describe the run's
// model: InputError naming the field (rope_scaling, biases, hidden_act, a size).
// F16 and BF16 tensors are converted. wpe may hold more positions than model.seq_len:
// the first seq_len are used. Returns the file read and one note per adaptation, for the
// log. InputError naming the file and tensor (and both shapes) for a missing, extra or
// mis-shaped tensor.
struct InitFromResult {
  std::string file;
  std::vector<std::string> notes;
};
InitFromResult load_hf_weights(const std::string& path, const ModelConfig& model,
                               const ParamLayout& layout, float* params);

}  // namespace pptrain
