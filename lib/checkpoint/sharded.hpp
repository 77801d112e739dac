// Sharded checkpoints (format_version 2), written by a multi-rank run without
// gathering the model anywhere: each (tp, pp) position writes its own pair of files
// into one temporary step dir, and one rank then commits the dir.
//
//   <dir>/step_00000100/model-tp<T>-pp<P>.safetensors      one per (T, P)
//                       optimizer-tp<T>-pp<P>.safetensors  "<name>.exp_avg", "<name>.exp_avg_sq"
//                       meta.json, config.json
//
// A shard file holds its layout entries (tied copies left out) under their global
// names with their LOCAL shapes. How each sits in the global tensor is recorded in the
// safetensors "__metadata__" under the key "pptrain.slicing", a JSON object string:
//   {"<tensor name>": {"global_shape": [..], "split_dim": d, "split_groups": g,
//                      "shard": s, "num_shards": n}, ...}
// with the meaning of ParamEntry's fields (split_dim -1: the whole tensor). meta.json
// records format_version 2, the layout {"tp", "pp", "dp"} and every shard file's size
// and checksum. load_checkpoint reads both formats into any layout.
//
// Under ZeRO-1 every data-parallel rank writes the optimizer state it holds instead, and
// the layout records "optimizer_by_dp": true:
//
//   <dir>/step_00000100/optimizer-tp<T>-pp<P>-dp<D>.safetensors   one per (T, P, D)
//
// A rank's state is a few flat ranges of its arena, which cut tensors anywhere. Each
// piece of a tensor in a range is stored 1-D under "<name>.exp_avg@<first element>"; its
// slicing record adds "tensor": "<name>.exp_avg", the tp piece's "local_shape" and
// "flat_range": [begin, end), the elements of the tp piece (flattened) it holds. The
// pieces of one tp piece, over the dp files, tile it exactly.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace pptrain {

inline constexpr int kShardedFormatVersion = 2;
inline constexpr const char* kSlicingMetadataKey = "pptrain.slicing";

// A file written into a temporary step dir: its name there, size and checksum.
struct FileRecord {
  std::string name;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

// The parallel layout that wrote a sharded checkpoint (recorded in meta.json).
struct ShardedLayout {
  int tp = 1, pp = 1, dp = 1;
  bool optimizer_by_dp = false;  // ZeRO-1: an optimizer file per (tp, pp, dp)
};

// "<kind>-tp<T>-pp<P>.safetensors", kind "model" or "optimizer".
std::string shard_file_name(const std::string& kind, int tp, int pp);
// "optimizer-tp<T>-pp<P>-dp<D>.safetensors".
std::string optimizer_dp_file_name(int tp, int pp, int dp);

// <dir>/step_%08lld: where the checkpoint of `step` is (or will be) installed.
std::string step_dir_path(const std::string& dir, int64_t step);

// <dir>/.tmp_step_%08lld: the temporary sibling dir a save of `step` writes into.
std::string temp_step_dir(const std::string& dir, int64_t step);

// Creates <dir> (if needed) and an empty temp_step_dir (removing one left by a crashed
// save). Returns its path; std::runtime_error on failure.
std::string create_temp_step_dir(const std::string& dir, int64_t step);

// Write this position's shard files into `tmp_dir` (fsynced; no file is left behind on
// failure, which throws std::runtime_error naming it). Entries marked tied_copy are
// skipped. Return the file's record for meta.json.
FileRecord write_model_shard(const std::string& tmp_dir, int tp, int pp, const ParamLayout& layout,
                             const float* params);
FileRecord write_optimizer_shard(const std::string& tmp_dir, int tp, int pp,
                                 const ParamLayout& layout, const float* exp_avg,
                                 const float* exp_avg_sq);

// Under ZeRO-1: this rank's optimizer state, the moments of the arena `ranges` (begin,
// end) packed range after range in `exp_avg` and `exp_avg_sq`.
FileRecord write_optimizer_ranges(const std::string& tmp_dir, int tp, int pp, int dp,
                                  const ParamLayout& layout,
                                  const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                                  const float* exp_avg, const float* exp_avg_sq);

// After every shard file is written: writes meta.json (format_version 2, `layout`,
// `files`) and meta.extra_files into the temp dir, fsyncs it, renames it to
// step_dir_path (replacing a dir of the same step), replaces <dir>/latest atomically and
// prunes step dirs beyond the newest `keep` (as save_checkpoint does). On failure the
// temp dir is removed, the previous checkpoints and `latest` are untouched and
// std::runtime_error says what failed. Returns the step dir path.
std::string commit_step_dir(const std::string& dir, int keep, const std::vector<FileRecord>& files,
                            const ShardedLayout& layout, const CheckpointMeta& meta);

// Removes the temp dir of a save that failed (no error if it does not exist).
void discard_temp_step_dir(const std::string& dir, int64_t step);

}  // namespace pptrain
