// Reading a Hugging Face model.safetensors (GPT-2's or Llama's) into any part of the
// model, after checking a Llama directory's config.json against the run's model.
#include "checkpoint/init_from.hpp"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/file_io.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"

namespace pptrain {

namespace {

constexpr const char* kPrefix = "transformer.";

// Stored tensors a file may hold that are not parameters pptrain keeps: GPT-2's
// attention mask buffers, older Llama files' rotary frequencies, and a tied head.
bool ignored(const std::string& name, const ModelConfig& model) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return (name == "lm_head.weight" && model.tie_embeddings) || ends_with(".attn.bias") ||
         ends_with(".attn.masked_bias") || ends_with(".rotary_emb.inv_freq");
}

// The name a model tensor has in the file: as pptrain names it, or without GPT-2's
// prefix (the original GPT-2 upload); "" when the file holds neither.
std::string stored_name(const SafetensorsFile& f, const std::string& name) {
  if (f.contains(name)) return name;
  if (name.rfind(kPrefix, 0) != 0) return "";
  const std::string bare = name.substr(std::string(kPrefix).size());
  return f.contains(bare) ? bare : "";
}

// A Llama directory's config.json (when there is one) describes the run's model and
// nothing pptrain's block lacks; InputError naming the field otherwise.
void check_llama_config(const std::string& path, const ModelConfig& m) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(InputFile(path, "config.json").read_all(1u << 20));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
  auto fail = [&](const std::string& field, const std::string& why) {
    throw InputError(path + ": " + field + ": " + why);
  };
  auto value = [&](const char* field, const nlohmann::json& fallback) {
    return j.contains(field) && !j[field].is_null() ? j[field] : fallback;
  };
  if (value("model_type", "llama") != "llama")
    fail("model_type", "is " + j["model_type"].dump() + ", the run's model.arch is llama");
  if (value("hidden_act", "silu") != "silu")
    fail("hidden_act", "is " + j["hidden_act"].dump() + "; pptrain's llama MLP is SwiGLU (silu)");
  if (!value("rope_scaling", nullptr).is_null())
    fail("rope_scaling", "is set; pptrain's rotary embedding has no scaling");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (value(bias, false) != false) fail(bias, "is true; pptrain's llama block has no biases");
  const std::pair<const char*, std::pair<double, const char*>> numbers[] = {
      {"hidden_size", {m.d_model, "model.d_model"}},
      {"intermediate_size", {ffn_width(m), "model.ffn_hidden"}},
      {"num_hidden_layers", {m.n_layer, "model.n_layer"}},
      {"num_attention_heads", {m.n_head, "model.n_head"}},
      {"num_key_value_heads", {kv_heads(m), "model.n_kv_head"}},
      {"vocab_size", {m.vocab_size, "model.vocab_size"}},
      {"rope_theta", {m.rope_theta, "model.rope_theta"}},
      {"rms_norm_eps", {m.norm_eps, "model.norm_eps"}}};
  for (const auto& [field, want] : numbers) {
    if (!j.contains(field)) continue;
    if (!j[field].is_number()) fail(field, "is " + j[field].dump() + ", not a number");
    const double got = j[field].get<double>();
    if (std::abs(got - want.first) > 1e-12 * std::abs(want.first))
      fail(field, "is " + j[field].dump() + ", the run's " + want.second + " is " +
                      (want.first == std::floor(want.first) && std::abs(want.first) < 1e15
                           ? std::to_string(int64_t(want.first))
                           : nlohmann::json(want.first).dump()));
  }
  const bool tied = value("tie_word_embeddings", false).is_boolean()
                        ? value("tie_word_embeddings", false).get<bool>() : false;
  if (tied != m.tie_embeddings)
    fail("tie_word_embeddings", std::string("is ") + (tied ? "true" : "false") +
                                    ", the run's model.tie_embeddings is " +
                                    (m.tie_embeddings ? "true" : "false"));
}

}  // namespace

InitFromResult load_hf_weights(const std::string& path, const ModelConfig& model,
                               const ParamLayout& layout, float* params) {
  namespace fs = std::filesystem;
  std::error_code ec;
  InitFromResult result;
  result.file = fs::is_directory(path, ec) ? (fs::path(path) / "model.safetensors").string() : path;
  if (!fs::exists(result.file, ec))
    throw InputError(result.file + ": checkpoint.init_from: no such file (a Hugging Face "
                                   "directory with model.safetensors, or the file)");
  const fs::path config_json = fs::path(result.file).parent_path() / "config.json";
  if (model.arch == Arch::Llama && fs::exists(config_json, ec))
    check_llama_config(config_json.string(), model);
  const SafetensorsFile f = SafetensorsFile::read(result.file);
  const ParamLayout whole = param_layout(model);
  auto fail = [&](const std::string& why) { throw InputError(result.file + ": " + why); };

  // Every model tensor is there, and nothing else but what GPT-2 files also carry.
  std::set<std::string> used;
  for (const ParamEntry& e : whole.entries()) {
    const std::string name = stored_name(f, e.name);
    if (name.empty()) fail("tensor " + e.name + " is missing (shape " + ckpt::shape_str(e.hf_shape) + ")");
    const std::vector<int64_t> shape = f.shape(name);
    const bool more_positions = e.name == "transformer.wpe.weight" && shape.size() == 2 &&
                                shape[1] == e.hf_shape[1] && shape[0] > e.hf_shape[0];
    if (shape != e.hf_shape && !more_positions)
      fail("tensor " + name + " has shape " + ckpt::shape_str(shape) + ", the model's is " +
           ckpt::shape_str(e.hf_shape));
    if (more_positions)
      result.notes.push_back("wpe: the first " + std::to_string(e.hf_shape[0]) + " of " +
                             std::to_string(shape[0]) + " positions (model.seq_len " +
                             std::to_string(model.seq_len) + ")");
    used.insert(name);
  }
  for (const std::string& name : f.names())
    if (!used.count(name) && !ignored(name, model))
      fail("unexpected tensor " + name + " (shape " + ckpt::shape_str(f.shape(name)) +
           "): not a tensor of this " + std::string(name_of(model.arch)) + " model");
  const std::string dtype = f.dtype(stored_name(f, whole.entries().front().name));
  if (dtype != "F32") result.notes.push_back(dtype + " weights converted to fp32");

  // This rank's slices; wpe's first seq_len rows are the first elements of its rows.
  for (const ParamEntry& e : layout.entries()) {
    const SafetensorsFile::Elements values = f.elements(stored_name(f, e.name));
    fill_from_global(e, [&](int64_t g) { return values[uint64_t(g)]; }, params + e.offset);
  }
  return result;
}

}  // namespace pptrain
