// Saving checkpoints: write a step dir beside the others, fsync, rename it into
// place, repoint `latest`, prune old steps.
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

void write_meta(const fs::path& path, const CheckpointMeta& meta, const WrittenFile& model,
                const WrittenFile& optim) {
  auto file_entry = [](const WrittenFile& w) {
    return nlohmann::json{{"bytes", w.bytes}, {"checksum", to_hex(w.checksum)}};
  };
  nlohmann::json j = {
      {"format_version", kCheckpointFormatVersion},
      {"step", meta.step},
      {"config_yaml", meta.config_yaml},
      {"train_state", meta.train_state},
      {"checksum_algorithm", kChecksumName},
      {"files",
       {{"model.safetensors", file_entry(model)}, {"optimizer.safetensors", file_entry(optim)}}},
  };
  const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  DurableWriter out(path.string());
  out.write(text.data(), text.size());
  out.finish();
}

// Writes the whole step dir at `tmp` (created here) and fsyncs it.
void write_step_dir(const fs::path& tmp, const ParamLayout& layout, const float* params,
                    const float* exp_avg, const float* exp_avg_sq, const CheckpointMeta& meta) {
  if (!fs::create_directory(tmp))
    throw std::runtime_error("cannot create " + tmp.string() + ": it already exists");
  std::vector<TensorView> model, optim;
  for (const auto& e : layout.entries()) {
    model.push_back({e.name, e.hf_shape, params + e.offset});
    optim.push_back({e.name + ".exp_avg", e.hf_shape, exp_avg + e.offset});
    optim.push_back({e.name + ".exp_avg_sq", e.hf_shape, exp_avg_sq + e.offset});
  }
  // transformers refuses safetensors weights whose metadata lacks format "pt".
  const WrittenFile m =
      write_safetensors_durable((tmp / "model.safetensors").string(), model, {{"format", "pt"}});
  const WrittenFile o = write_safetensors_durable((tmp / "optimizer.safetensors").string(), optim,
                                                  {{"format", "pt"}});
  write_meta(tmp / "meta.json", meta, m, o);
  for (const auto& [file_name, text] : meta.extra_files) {
    DurableWriter out((tmp / file_name).string());
    out.write(text.data(), text.size());
    out.finish();
  }
  fsync_dir(tmp.string());
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

}  // namespace

std::string save_checkpoint(const std::string& dir, int keep, const ParamLayout& layout,
                            const float* params, const float* exp_avg, const float* exp_avg_sq,
                            const CheckpointMeta& meta) {
  PPTRAIN_CHECK(params && exp_avg && exp_avg_sq, "save_checkpoint needs all three arenas");
  PPTRAIN_CHECK(meta.step >= 0, "negative step");
  const fs::path root(dir);
  const std::string name = step_dir_name(meta.step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / (".tmp_" + name);
  try {
    if (fs::create_directories(root)) {
      fs::path abs = fs::absolute(root);
      if (!abs.has_filename()) abs = abs.parent_path();  // "ckpt/" -> "ckpt"
      fsync_dir(abs.parent_path().string());
    }
    fs::remove_all(tmp);  // left over from a crashed save
    try {
      write_step_dir(tmp, layout, params, exp_avg, exp_avg_sq, meta);
      install_dir(tmp, final_dir);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
    fsync_dir(root.string());
    write_file_atomic((root / "latest").string(), name + "\n");
  } catch (const std::exception& e) {
    throw std::runtime_error("saving checkpoint " + final_dir.string() + " failed: " + e.what());
  }
  prune(root, keep, meta.step);
  spdlog::info("saved checkpoint {}", final_dir.string());
  return final_dir.string();
}

bool has_checkpoints(const std::string& dir) { return !list_step_dirs(dir).empty(); }

}  // namespace pptrain
