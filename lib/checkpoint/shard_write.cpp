// Writing one position's shard files of a sharded checkpoint: local slices under
// their global names, with the slicing of each recorded in the file's metadata.
#include <nlohmann/json.hpp>

#include <algorithm>

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

std::string optimizer_dp_file_name(int tp, int pp, int dp) {
  return "optimizer-tp" + std::to_string(tp) + "-pp" + std::to_string(pp) + "-dp" +
         std::to_string(dp) + ".safetensors";
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

FileRecord write_optimizer_ranges(const std::string& tmp_dir, int tp, int pp, int dp,
                                  const ParamLayout& layout,
                                  const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                                  const float* exp_avg, const float* exp_avg_sq) {
  PPTRAIN_CHECK(exp_avg && exp_avg_sq, "write_optimizer_ranges needs both moments");
  std::vector<TensorView> tensors;
  nlohmann::json slicing = nlohmann::json::object();
  std::size_t packed = 0;  // where the range being cut starts in the packed moments
  for (const auto& [begin, end] : ranges) {
    for (const ParamEntry& e : layout.entries()) {
      const std::size_t from = std::max(begin, e.offset), to = std::min(end, e.offset + e.numel);
      if (e.tied_copy || from >= to) continue;
      for (const auto& [suffix, moments] : {std::pair{".exp_avg", exp_avg}, {".exp_avg_sq", exp_avg_sq}}) {
        const std::string name = e.name + suffix + "@" + std::to_string(from - e.offset);
        tensors.push_back({name, {int64_t(to - from)}, moments + packed + (from - begin)});
        nlohmann::json record = slicing_json(e);
        record["tensor"] = e.name + suffix;
        record["local_shape"] = e.shape;
        record["flat_range"] = {from - e.offset, to - e.offset};
        slicing[name] = std::move(record);
      }
    }
    packed += end - begin;
  }
  const std::string file_name = optimizer_dp_file_name(tp, pp, dp);
  const WrittenFile w = write_safetensors_durable(
      tmp_dir + "/" + file_name, tensors, {{"format", "pt"}, {kSlicingMetadataKey, slicing.dump()}});
  return {file_name, w.bytes, w.checksum};
}

}  // namespace pptrain
