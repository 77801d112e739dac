// Writing one position's shard files of a sharded checkpoint: local slices under
// their global names, with the slicing of each recorded in the file's metadata.
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/sharded.hpp"
#include "core/error.hpp"

namespace pptrain {

using namespace ckpt;

namespace {

nlohmann::json slicing_json(const ParamEntry& e) {
  return {{"global_shape", e.hf_shape},
          {"split_dim", e.split_dim},
          {"split_groups", e.split_groups},
          {"shard", e.shard},
          {"num_shards", e.num_shards}};
}

// One tensor per (entry, suffix) from the arenas, tied copies left out.
FileRecord write_shard(const std::string& tmp_dir, const std::string& file_name,
                       const ParamLayout& layout,
                       const std::vector<std::pair<std::string, const float*>>& arenas) {
  std::vector<TensorView> tensors;
  nlohmann::json slicing = nlohmann::json::object();
  for (const ParamEntry& e : layout.entries()) {
    if (e.tied_copy) continue;
    for (const auto& [suffix, arena] : arenas) {
      tensors.push_back({e.name + suffix, e.shape, arena + e.offset});
      slicing[e.name + suffix] = slicing_json(e);
    }
  }
  const std::string path = tmp_dir + "/" + file_name;
  const WrittenFile w = write_safetensors_durable(
      path, tensors, {{"format", "pt"}, {kSlicingMetadataKey, slicing.dump()}});
  return {file_name, w.bytes, w.checksum};
}

}  // namespace

std::string shard_file_name(const std::string& kind, int tp, int pp) {
  return kind + "-tp" + std::to_string(tp) + "-pp" + std::to_string(pp) + ".safetensors";
}

FileRecord write_model_shard(const std::string& tmp_dir, int tp, int pp, const ParamLayout& layout,
                             const float* params) {
  PPTRAIN_CHECK(params != nullptr, "write_model_shard needs the parameters");
  return write_shard(tmp_dir, shard_file_name("model", tp, pp), layout, {{"", params}});
}

FileRecord write_optimizer_shard(const std::string& tmp_dir, int tp, int pp,
                                 const ParamLayout& layout, const float* exp_avg,
                                 const float* exp_avg_sq) {
  PPTRAIN_CHECK(exp_avg && exp_avg_sq, "write_optimizer_shard needs both moments");
  return write_shard(tmp_dir, shard_file_name("optimizer", tp, pp), layout,
                     {{".exp_avg", exp_avg}, {".exp_avg_sq", exp_avg_sq}});
}

}  // namespace pptrain
