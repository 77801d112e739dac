// Training checkpoints: one directory per step holding the weights, the AdamW moments
// and meta.json (step, config, trainer state, file checksums). Saves are atomic;
// `latest` names the newest step dir. A one-rank run writes the single-file format
// (format_version 1), whose weights are a Hugging Face GPT-2 model.safetensors:
//
//   <dir>/step_00000100/{model.safetensors, optimizer.safetensors, meta.json}
//   <dir>/latest          text file: "step_00000100"
//
// Multi-rank runs write one file pair per (tp, pp) position instead (format_version 2,
// sharded.hpp). Either format loads into any layout.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model/param_layout.hpp"

namespace pptrain {

inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointMeta {
  int64_t step = 0;            // optimizer steps completed
  std::string config_yaml;     // resolved config of the run that saved it
  nlohmann::json train_state;  // trainer-owned extras (data cursor, rng, loss so far...)
  // Small text files written into the step dir beside the tensors, by file name
  // (e.g. the Hugging Face config.json). Not read back by load_checkpoint.
  std::map<std::string, std::string> extra_files;
};

// Writes <dir>/step_%08lld/ (model.safetensors: every layout entry under its HF name
// and hf_shape; optimizer.safetensors: "<name>.exp_avg" and "<name>.exp_avg_sq";
// meta.json), fsyncing each file, through a temporary sibling dir renamed into place
// (an existing dir of the same step is replaced atomically). Then replaces <dir>/latest
// atomically and removes step dirs beyond the newest `keep` by step number (keep <= 0
// keeps all; the dir just written is never removed). Creates <dir> if needed. On
// failure the previous checkpoints and `latest` are untouched and std::runtime_error
// says what failed. Returns the step dir path.
std::string save_checkpoint(const std::string& dir, int keep, const ParamLayout& layout,
                            const float* params, const float* exp_avg, const float* exp_avg_sq,
                            const CheckpointMeta& meta);

// "" -> "" (fresh start). "auto" -> the newest valid step dir in `dir` (`latest` first,
// else step_* dirs newest first, skipping invalid ones with a warning), or "" if none.
// Anything else is a path: a step dir, or a checkpoint root whose `latest` is followed;
// InputError naming it if it is not a valid checkpoint. Validation (either format)
// reads meta.json and every tensor file, checks their checksums and that every tensor
// (every shard of it) is present.
std::string resolve_resume(const std::string& dir, const std::string& resume);

// Loads a step dir of either format into `layout`, any part (pipeline chunks, tensor-
// parallel shard) of the model whose every tensor `whole` lists (param_layout of the
// model): the stored tensors must be exactly `whole`'s, of its global shapes. Each entry
// is assembled in its global form from the stored pieces that hold it (their recorded
// slicing) and this layout's slice is taken; padding (vocab rows beyond hf_shape) is
// set to 0; tied copies are loaded like the tensor they copy. Only the files read are
// checksummed, all before anything is written to the arenas. exp_avg and exp_avg_sq may
// both be nullptr to load weights only (optimizer files are then not read). Any problem
// (a different model, a missing shard, a corrupt file) is an InputError "PATH: reason".
CheckpointMeta load_checkpoint(const std::string& path, const ParamLayout& whole,
                               const ParamLayout& layout, float* params, float* exp_avg,
                               float* exp_avg_sq);
// The same with layout == whole (the whole model on one rank).
CheckpointMeta load_checkpoint(const std::string& path, const ParamLayout& layout, float* params,
                               float* exp_avg, float* exp_avg_sq);

// Hugging Face config.json text for `model` (GPT2LMHeadModel's or LlamaForCausalLM's;
// saved as an extra file of each checkpoint so transformers can load the step dir).
std::string hf_config(const ModelConfig& model);

// True when `dir` holds any step_* checkpoint directory.
bool has_checkpoints(const std::string& dir);

}  // namespace pptrain
