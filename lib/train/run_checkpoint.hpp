// Checkpoints of a run in any parallel layout. A one-rank run writes the single-file
// Hugging Face-shaped checkpoint. A multi-rank run writes a sharded one without
// gathering the model: each (tp, pp) position's data-parallel rank 0 writes its own
// model and optimizer shard files into a shared temporary step dir (under ZeRO-1 every
// data-parallel rank writes its own optimizer file), and rank 0 commits it. Loading has every rank assemble its own slices from whichever files hold them,
// so a checkpoint saved in one layout resumes in any other.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "train/session.hpp"

namespace pptrain {

// The AdamW moments a rank saves, in host memory: those of its optimizer's ranges, packed
// range after range (AdamW::exp_avg's order). Without ZeRO-1 that is the whole arena,
// and data-parallel rank 0 writes them; under it each data-parallel rank writes its own.
struct SavedMoments {
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  const std::vector<std::pair<std::size_t, std::size_t>>* ranges = nullptr;
};

// Collective. `params` is this rank's whole-arena master weights in host memory.
// Returns the step dir written (on every rank). If any rank fails, every rank throws
// std::runtime_error, the partial temp dir is removed and the previous checkpoints and
// `latest` are left as they were.
std::string save_run_checkpoint(Session& s, const float* params, const SavedMoments& moments,
                                const CheckpointMeta& meta);

// Loads `path` (either format, any layout) into this rank's whole-arena host arrays: the
// parameters and, when the moment arenas are given (both or neither), the optimizer
// moments. Every rank calls it; a rank reads only the files holding its slices.
// InputError for a bad or mismatched checkpoint.
CheckpointMeta load_run_checkpoint(Session& s, const std::string& path, float* params,
                                   float* exp_avg, float* exp_avg_sq);

// This rank's weights from checkpoint.init_from (a Hugging Face GPT-2 model), into its
// whole-arena host array, logged on rank 0 with what was adapted. InputError for a file
// that does not fit the model.
void init_from_hf(Session& s, float* params);

}  // namespace pptrain
