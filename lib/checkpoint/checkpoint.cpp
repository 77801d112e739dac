// Saving checkpoints: write a temporary step dir beside the others, fsync, rename it
// into place, repoint `latest`, prune old steps. The single-file format is written here
// in one call; sharded saves use the same temp-dir and commit steps (sharded.hpp).
#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "checkpoint/file_io.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/sharded.hpp"
#include "checkpoint/step_dirs.hpp"
#include "core/error.hpp"

namespace pptrain {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

// Moves the finished `tmp` dir to `final_dir`. An existing `final_dir` (the same step
// saved again) is swapped out atomically where the filesystem allows, then removed.
void install_dir(const fs::path& tmp, const fs::path& final_dir) {
  if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return;
  if (errno != EEXIST && errno != ENOTEMPTY)
    throw std::runtime_error("cannot rename " + tmp.string() + " to " + final_dir.string() + ": " +
                             std::strerror(errno));
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS)
      throw std::runtime_error("cannot swap " + tmp.string() + " with " + final_dir.string() +
                               ": " + std::strerror(errno));
    // No atomic exchange here: move the old dir aside first.
    const fs::path old = final_dir.parent_path() / (".old_" + final_dir.filename().string());
    fs::remove_all(old);
    fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    std::error_code ec;
    fs::remove_all(old, ec);
    return;
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);  // now holds the replaced checkpoint
}

// Removes step dirs beyond the newest `keep`, never `current`. Failures only warn:
// the checkpoint itself is already safe.
void prune(const fs::path& root, int keep, int64_t current) {
  if (keep <= 0) return;
  const auto steps = list_step_dirs(root);
  for (std::size_t i = static_cast<std::size_t>(keep); i < steps.size(); ++i) {
    const auto& [step, path] = steps[i];
    if (step == current) continue;
    // Rename first so that a crash mid-removal leaves no half-deleted step dir.
    const fs::path doomed = root / (".old_" + path.filename().string());
    std::error_code ec;
    fs::remove_all(doomed, ec);
    fs::rename(path, doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
    if (ec) spdlog::warn("could not remove old checkpoint {}: {}", path.string(), ec.message());
  }
}

void write_text(const fs::path& path, const std::string& text) {
  DurableWriter out(path.string());
  out.write(text.data(), text.size());
  out.finish();
}

// meta.json's fields common to both formats, `files` mapping file name -> size and checksum.
nlohmann::json meta_json(int version, const CheckpointMeta& meta,
                         const std::vector<FileRecord>& files) {
  nlohmann::json listed = nlohmann::json::object();
  for (const FileRecord& f : files)
    listed[f.name] = {{"bytes", f.bytes}, {"checksum", to_hex(f.checksum)}};
  return {{"format_version", version},       {"step", meta.step},
          {"config_yaml", meta.config_yaml}, {"train_state", meta.train_state},
          {"checksum_algorithm", kChecksumName}, {"files", listed}};
}

// The tail of every save, with the tensor files already in the temp dir: meta.json and
// the extra files, fsync, install, `latest`, prune. Removes the temp dir on failure.
std::string finish_step_dir(const std::string& dir, int keep, const nlohmann::json& meta_j,
                            const CheckpointMeta& meta) {
  const fs::path root(dir), tmp(temp_step_dir(dir, meta.step));
  const fs::path final_dir(step_dir_path(dir, meta.step));
  try {
    try {
      const std::string meta_text =
          meta_j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      write_text(tmp / "meta.json", meta_text);
      write_text(tmp / kMetaSealName, meta_seal(meta_text));
      for (const auto& [file_name, text] : meta.extra_files) write_text(tmp / file_name, text);
      fsync_dir(tmp.string());
      install_dir(tmp, final_dir);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
    fsync_dir(root.string());
    write_file_atomic((root / "latest").string(), final_dir.filename().string() + "\n");
  } catch (const std::exception& e) {
    throw std::runtime_error("saving checkpoint " + final_dir.string() + " failed: " + e.what());
  }
  prune(root, keep, meta.step);
  spdlog::info("saved checkpoint {}", final_dir.string());
  return final_dir.string();
}

}  // namespace

std::string step_dir_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / step_dir_name(step)).string();
}

std::string temp_step_dir(const std::string& dir, int64_t step) {
  return (fs::path(dir) / (".tmp_" + step_dir_name(step))).string();
}

std::string create_temp_step_dir(const std::string& dir, int64_t step) {
  PPTRAIN_CHECK(step >= 0, "negative step");
  const fs::path root(dir), tmp(temp_step_dir(dir, step));
  try {
    if (fs::create_directories(root)) {
      fs::path abs = fs::absolute(root);
      if (!abs.has_filename()) abs = abs.parent_path();  // "ckpt/" -> "ckpt"
      fsync_dir(abs.parent_path().string());
    }
    fs::remove_all(tmp);  // left over from a crashed save
    if (!fs::create_directory(tmp))
      throw std::runtime_error("cannot create " + tmp.string() + ": it already exists");
  } catch (const std::exception& e) {
    throw std::runtime_error("saving checkpoint " + step_dir_path(dir, step) + " failed: " +
                             e.what());
  }
  return tmp.string();
}

void discard_temp_step_dir(const std::string& dir, int64_t step) {
  std::error_code ec;
  fs::remove_all(temp_step_dir(dir, step), ec);
  if (ec) spdlog::warn("could not remove {}: {}", temp_step_dir(dir, step), ec.message());
}

std::string save_checkpoint(const std::string& dir, int keep, const ParamLayout& layout,
                            const float* params, const float* exp_avg, const float* exp_avg_sq,
                            const CheckpointMeta& meta) {
  PPTRAIN_CHECK(params && exp_avg && exp_avg_sq, "save_checkpoint needs all three arenas");
  const fs::path tmp(create_temp_step_dir(dir, meta.step));
  std::vector<TensorView> model, optim;
  for (const auto& e : layout.entries()) {
    model.push_back({e.name, e.hf_shape, params + e.offset});
    optim.push_back({e.name + ".exp_avg", e.hf_shape, exp_avg + e.offset});
    optim.push_back({e.name + ".exp_avg_sq", e.hf_shape, exp_avg_sq + e.offset});
  }
  std::vector<FileRecord> files;
  try {
    // transformers refuses safetensors weights whose metadata lacks format "pt".
    for (const auto& [name, tensors] : {std::pair{"model.safetensors", &model},
                                        std::pair{"optimizer.safetensors", &optim}}) {
      const WrittenFile w = write_safetensors_durable((tmp / name).string(), *tensors,
                                                      {{"format", "pt"}});
      files.push_back({name, w.bytes, w.checksum});
    }
  } catch (const std::exception& e) {
    discard_temp_step_dir(dir, meta.step);
    throw std::runtime_error("saving checkpoint " + step_dir_path(dir, meta.step) + " failed: " +
                             e.what());
  }
  return finish_step_dir(dir, keep, meta_json(kCheckpointFormatVersion, meta, files), meta);
}

std::string commit_step_dir(const std::string& dir, int keep, const std::vector<FileRecord>& files,
                            const ShardedLayout& layout, const CheckpointMeta& meta) {
  // Every listed file must be in the temp dir as recorded: a writer whose files went
  // elsewhere (a checkpoint dir not shared by every node) fails here, not at resume.
  for (const FileRecord& f : files) {
    const fs::path path = fs::path(temp_step_dir(dir, meta.step)) / f.name;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec || size != f.bytes) {
      discard_temp_step_dir(dir, meta.step);
      throw std::runtime_error("saving checkpoint " + step_dir_path(dir, meta.step) +
                               " failed: " + path.string() + " is " +
                               (ec ? "missing" : std::to_string(size) + " bytes, not " +
                                                     std::to_string(f.bytes)) +
                               " (is checkpoint.dir on a filesystem every rank shares?)");
    }
  }
  nlohmann::json j = meta_json(kShardedFormatVersion, meta, files);
  j["layout"] = {{"tp", layout.tp}, {"pp", layout.pp}, {"dp", layout.dp}};
  if (layout.optimizer_by_dp) j["layout"]["optimizer_by_dp"] = true;
  return finish_step_dir(dir, keep, j, meta);
}

bool has_checkpoints(const std::string& dir) { return !list_step_dirs(dir).empty(); }

}  // namespace pptrain
