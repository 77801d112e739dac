// The Hugging Face config.json describing a checkpoint's model.safetensors, so that
// transformers' GPT2LMHeadModel or LlamaForCausalLM .from_pretrained(step_dir) loads it.
#include "checkpoint/checkpoint.hpp"

namespace pptrain {

namespace {

nlohmann::json llama_config(const ModelConfig& m) {
  return {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.d_model},
      {"intermediate_size", ffn_width(m)},
      {"num_hidden_layers", m.n_layer},
      {"num_attention_heads", m.n_head},
      {"num_key_value_heads", kv_heads(m)},
      {"hidden_act", "silu"},
      {"max_position_embeddings", m.seq_len},
      {"rms_norm_eps", m.norm_eps},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", nullptr},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"pretraining_tp", 1},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", m.tie_embeddings},
      {"torch_dtype", "float32"},
  };
}

}  // namespace

std::string hf_config(const ModelConfig& m) {
  if (m.arch == Arch::Llama) return llama_config(m).dump(2) + "\n";
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
