// Reading a Hugging Face GPT-2 model.safetensors into any part of the model.
#include "checkpoint/init_from.hpp"

#include <filesystem>
#include <set>

#include "checkpoint/file_io.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"

namespace pptrain {

namespace {

constexpr const char* kPrefix = "transformer.";

// Stored tensors a GPT-2 file may hold that are not parameters pptrain keeps.
bool ignored(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return name == "lm_head.weight" || ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

// The name a model tensor has in the file: as pptrain names it, or without the prefix
// (the original GPT-2 upload); "" when the file holds neither.
std::string stored_name(const SafetensorsFile& f, const std::string& name) {
  if (f.contains(name)) return name;
  const std::string bare = name.substr(std::string(kPrefix).size());
  return f.contains(bare) ? bare : "";
}

}  // namespace

InitFromResult load_hf_weights(const std::string& path, const ModelConfig& model,
                               const ParamLayout& layout, float* params) {
  namespace fs = std::filesystem;
  std::error_code ec;
  InitFromResult result;
  result.file = fs::is_directory(path, ec) ? (fs::path(path) / "model.safetensors").string() : path;
  if (!fs::exists(result.file, ec))
    throw InputError(result.file + ": checkpoint.init_from: no such file (a Hugging Face GPT-2 "
                                   "directory with model.safetensors, or the file)");
  const SafetensorsFile f = SafetensorsFile::read(result.file);
  const ParamLayout whole = gpt_param_layout(model);
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
    if (!used.count(name) && !ignored(name))
      fail("unexpected tensor " + name + " (shape " + ckpt::shape_str(f.shape(name)) +
           "): not a tensor of this GPT-2 model");
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
