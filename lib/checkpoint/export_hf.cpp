// Export to a Hugging Face directory (GPT-2 or Llama): the whole model's tensors, each assembled
// from a checkpoint's pieces and streamed to model.safetensors.
#include "checkpoint/export_hf.hpp"

#include <filesystem>
#include <set>
#include <system_error>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/open_checkpoint.hpp"
#include "config/config.hpp"
#include "core/error.hpp"

namespace pptrain {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

// Pieces that hold all of stored tensor `name`: a whole piece, else one of every shard.
std::vector<const Piece*> whole_tensor(const OpenCheckpoint& ck, const std::string& name) {
  const std::vector<Piece>& pieces = ck.tensors[kModel].at(name);
  for (const Piece& p : pieces)
    if (p.slicing.replicated()) return {&p};
  std::vector<const Piece*> out;
  std::set<int> shards;
  for (const Piece& p : pieces)
    if (shards.insert(p.slicing.shard).second) out.push_back(&p);
  return out;
}

void check_out_dir(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec) || !fs::is_empty(out, ec))
    throw InputError(out.string() + ": exists and is not an empty directory; refusing to "
                                    "overwrite it (choose a new --out)");
}

}  // namespace

ExportSummary export_hf(const std::string& checkpoint, const std::string& out_dir) {
  fs::path out(out_dir);
  if (!out.has_filename()) out = out.parent_path();  // "hf/" -> "hf"
  if (checkpoint.empty()) throw InputError("--checkpoint is required");
  check_out_dir(out);
  ExportSummary summary;
  // A path, even one named "auto": a step dir or a root whose latest is followed.
  summary.step_dir = resolve_resume("", checkpoint == "auto" ? "./auto" : checkpoint);
  // resolve_resume checked every file and checksum.
  OpenCheckpoint ck = open_checkpoint(summary.step_dir, /*with_optimizer=*/false,
                                      /*verify_all=*/false);
  summary.step = ck.meta.step;
  const ModelConfig model =
      parse_config(ck.meta.config_yaml, summary.step_dir + "/meta.json").model;
  const ParamLayout whole = param_layout(model);
  match_model(ck, kModel, whole, {""});

  std::vector<TensorSpec> specs;
  std::vector<std::vector<const Piece*>> pieces;
  for (const ParamEntry& e : whole.entries()) {
    specs.push_back({e.name, e.hf_shape});
    pieces.push_back(whole_tensor(ck, e.name));
  }
  const fs::path tmp = out.parent_path() / ("." + out.filename().string() + ".tmp-export");
  std::error_code ec;
  fs::remove_all(tmp, ec);  // left by an export that crashed
  try {
    fs::create_directories(tmp);
    std::vector<float> global;
    const WrittenFile written = write_safetensors_streamed(
        (tmp / "model.safetensors").string(), specs, {{"format", "pt"}}, [&](std::size_t i) {
          global.assign(whole.entries()[i].hf_numel(), 0.0f);
          assemble_global(ck, pieces[i], global.data());
          return global.data();
        });
    write_file_atomic((tmp / "config.json").string(), hf_config(model));
    fsync_dir(tmp.string());
    if (fs::exists(out, ec)) fs::remove(out);  // empty (checked above)
    fs::rename(tmp, out);
    fsync_dir(out.parent_path().empty() ? "." : out.parent_path().string());
    summary.tensors = specs.size();
    summary.bytes = written.bytes;
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw std::runtime_error(std::string("export to ") + out.string() + ": " + e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return summary;
}

}  // namespace pptrain
