// Finding checkpoints: the `resume` setting ("", "auto" or a path), `latest`, and
// skipping step dirs that fail validation (either format; every checksum verified).
#include <spdlog/spdlog.h>

#include <filesystem>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/open_checkpoint.hpp"
#include "checkpoint/step_dirs.hpp"
#include "core/error.hpp"

namespace pptrain {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

void validate(const fs::path& dir) { open_checkpoint(dir, true, /*verify_all=*/true); }

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
      validate(tried);
      return tried.string();
    } catch (const InputError& e) {
      spdlog::warn("ignoring the latest checkpoint: {}", e.what());
    }
  }
  for (const auto& [step, path] : list_step_dirs(root)) {
    if (path == tried) continue;
    try {
      validate(path);
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
    validate(path);
    return path.string();
  }
  if (fs::exists(path / "latest", ec)) {
    const fs::path step = follow_latest(path);
    validate(step);
    return step.string();
  }
  throw InputError(resume + ": not a checkpoint (neither meta.json nor a latest file)");
}

}  // namespace pptrain
