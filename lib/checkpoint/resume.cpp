// Finding and loading checkpoints: meta.json and checksum verification, the
// `resume` setting ("", "auto" or a path), and copying tensors into the arenas.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/step_dirs.hpp"
#include "core/error.hpp"

namespace pptrain {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

struct OpenCheckpoint {
  CheckpointMeta meta;
  SafetensorsFile model;
  std::optional<SafetensorsFile> optim;
};

nlohmann::json read_json(const std::string& path) {
  MappedFile file(path);
  try {
    return nlohmann::json::parse(file.data(), file.data() + file.size());
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
}

// Reads `name` in `dir` and checks it against its size and checksum in meta.json.
SafetensorsFile open_verified(const fs::path& dir, const std::string& name,
                              const nlohmann::json& files, const std::string& meta_path) {
  auto entry = files.find(name);
  if (entry == files.end() || !entry->is_object() || !entry->contains("bytes") ||
      !(*entry)["bytes"].is_number_unsigned() || !entry->contains("checksum") ||
      !(*entry)["checksum"].is_string())
    throw InputError(meta_path + ": no size and checksum recorded for " + name);
  const std::string path = (dir / name).string();
  SafetensorsFile file = SafetensorsFile::read(path);
  const uint64_t want_bytes = (*entry)["bytes"].get<uint64_t>();
  if (file.bytes().size() != want_bytes)
    throw InputError(path + ": file has " + std::to_string(file.bytes().size()) +
                     " bytes but meta.json records " + std::to_string(want_bytes));
  Checksum sum;
  sum.update(file.bytes().data(), file.bytes().size());
  const std::string got = to_hex(sum.value());
  const std::string want = (*entry)["checksum"].get<std::string>();
  if (got != want)
    throw InputError(path + ": checksum mismatch (file " + got + ", meta.json " + want +
                     "): the file is corrupt");
  return file;
}

// Parses and verifies a step dir: meta.json, then the tensor files' checksums.
OpenCheckpoint open_checkpoint(const fs::path& dir, bool with_optimizer) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir.string() + ": no such checkpoint directory");
  const std::string meta_path = (dir / "meta.json").string();
  const nlohmann::json j = read_json(meta_path);
  auto bad = [&](const std::string& why) { return InputError(meta_path + ": " + why); };
  if (!j.is_object()) throw bad("not a JSON object");
  if (!j.contains("format_version") || !j["format_version"].is_number_integer())
    throw bad("no integer format_version");
  if (j["format_version"].get<int64_t>() != kCheckpointFormatVersion)
    throw bad("format_version " + j["format_version"].dump() + " is not supported (expected " +
              std::to_string(kCheckpointFormatVersion) + ")");
  if (!j.contains("step") || !j["step"].is_number_integer() || j["step"].get<int64_t>() < 0)
    throw bad("no valid step");
  if (!j.contains("config_yaml") || !j["config_yaml"].is_string()) throw bad("no config_yaml");
  if (j.value("checksum_algorithm", std::string()) != kChecksumName)
    throw bad(std::string("checksum_algorithm is not ") + kChecksumName);
  if (!j.contains("files") || !j["files"].is_object()) throw bad("no files object");

  OpenCheckpoint out{{j["step"].get<int64_t>(), j["config_yaml"].get<std::string>(),
                      j.value("train_state", nlohmann::json()), {}},
                     open_verified(dir, "model.safetensors", j["files"], meta_path),
                     std::nullopt};
  if (with_optimizer)
    out.optim = open_verified(dir, "optimizer.safetensors", j["files"], meta_path);
  return out;
}

// Every layout entry + suffix must be present with its hf_shape, and nothing else.
void check_tensors(const SafetensorsFile& file, const ParamLayout& layout,
                   const std::vector<std::string>& suffixes) {
  std::set<std::string> expected;
  for (const auto& e : layout.entries()) {
    for (const auto& s : suffixes) {
      const std::string name = e.name + s;
      if (!file.contains(name)) throw InputError(file.path() + ": tensor " + name + " is missing");
      if (file.shape(name) != e.hf_shape)
        throw InputError(file.path() + ": tensor " + name + " has shape " +
                         shape_str(file.shape(name)) + ", expected " + shape_str(e.hf_shape));
      expected.insert(name);
    }
  }
  for (const auto& name : file.names())
    if (!expected.count(name))
      throw InputError(file.path() + ": unexpected tensor " + name +
                       " (the checkpoint is of a different model)");
}

void copy_tensors(const SafetensorsFile& file, const ParamLayout& layout, const std::string& suffix,
                  float* arena) {
  for (const auto& e : layout.entries()) {
    file.copy_to(e.name + suffix, e.hf_shape, arena + e.offset);
    std::fill(arena + e.offset + e.hf_numel(), arena + e.offset + e.numel, 0.0f);
  }
}

// The step dir named by <root>/latest; InputError if `latest` is unreadable or odd.
fs::path follow_latest(const fs::path& root) {
  const std::string latest = (root / "latest").string();
  MappedFile file(latest);
  std::string name(file.data(), file.size());
  name.erase(name.find_last_not_of(" \t\r\n") + 1);
  if (!parse_step_name(name)) throw InputError(latest + ": does not name a step_<N> directory");
  return root / name;
}

std::string newest_valid(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return "";
  fs::path tried;
  if (fs::exists(root / "latest", ec)) {
    try {
      tried = follow_latest(root);
      open_checkpoint(tried, true);
      return tried.string();
    } catch (const InputError& e) {
      spdlog::warn("ignoring the latest checkpoint: {}", e.what());
    }
  }
  for (const auto& [step, path] : list_step_dirs(root)) {
    if (path == tried) continue;
    try {
      open_checkpoint(path, true);
      return path.string();
    } catch (const InputError& e) {
      spdlog::warn("skipping invalid checkpoint {}: {}", path.string(), e.what());
    }
  }
  return "";
}

}  // namespace

std::string resolve_resume(const std::string& dir, const std::string& resume) {
  if (resume.empty()) return "";
  if (resume == "auto") return newest_valid(dir);
  fs::path path(resume);
  if (!path.has_filename()) path = path.parent_path();  // "x/step_5/" -> "x/step_5"
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw InputError(resume + ": no such checkpoint directory");
  if (fs::exists(path / "meta.json", ec) || parse_step_name(path.filename().string())) {
    open_checkpoint(path, true);
    return path.string();
  }
  if (fs::exists(path / "latest", ec)) {
    const fs::path step = follow_latest(path);
    open_checkpoint(step, true);
    return step.string();
  }
  throw InputError(resume + ": not a checkpoint (neither meta.json nor a latest file)");
}

CheckpointMeta load_checkpoint(const std::string& path, const ParamLayout& layout, float* params,
                               float* exp_avg, float* exp_avg_sq) {
  PPTRAIN_CHECK(params != nullptr, "load_checkpoint needs a parameter arena");
  PPTRAIN_CHECK((exp_avg == nullptr) == (exp_avg_sq == nullptr),
                "load both optimizer moments or neither");
  const bool with_optimizer = exp_avg != nullptr;
  OpenCheckpoint ckpt = open_checkpoint(path, with_optimizer);
  check_tensors(ckpt.model, layout, {""});
  if (with_optimizer) check_tensors(*ckpt.optim, layout, {".exp_avg", ".exp_avg_sq"});
  copy_tensors(ckpt.model, layout, "", params);
  if (with_optimizer) {
    copy_tensors(*ckpt.optim, layout, ".exp_avg", exp_avg);
    copy_tensors(*ckpt.optim, layout, ".exp_avg_sq", exp_avg_sq);
  }
  spdlog::info("loaded checkpoint {} (step {})", path, ckpt.meta.step);
  return ckpt.meta;
}

}  // namespace pptrain
