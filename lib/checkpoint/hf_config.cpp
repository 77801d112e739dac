// The Hugging Face GPT-2 config.json describing a checkpoint's model.safetensors, so
// that transformers' GPT2LMHeadModel.from_pretrained(step_dir) can load it.
#include "checkpoint/checkpoint.hpp"

namespace pptrain {

std::string hf_gpt2_config(const ModelConfig& m) {
  const nlohmann::json j = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", m.vocab_size},
      {"n_positions", m.seq_len},
      {"n_ctx", m.seq_len},
      {"n_embd", m.d_model},
      {"n_layer", m.n_layer},
      {"n_head", m.n_head},
      {"n_inner", nullptr},  // 4 * n_embd
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      {"initializer_range", 0.02},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  return j.dump(2) + "\n";
}

}  // namespace pptrain
