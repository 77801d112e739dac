// Checkpoints of a run in any parallel layout. Saving gathers every tensor's global
// GPT-2 form (tensor-parallel slices assembled, pipeline stages collected) on rank 0,
// which writes one ordinary checkpoint; loading has every rank read it and keep its own
// slice. So a checkpoint saved in one layout resumes in any other.
#pragma once
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "train/session.hpp"

namespace pptrain {

// Collective. `exp_avg`/`exp_avg_sq` are this rank's whole-arena AdamW moments.
// Returns the step dir written (on every rank). Throws on any rank if rank 0's save
// failed; the previous checkpoints are left as they were.
std::string save_run_checkpoint(Session& s, const float* exp_avg, const float* exp_avg_sq,
                                const CheckpointMeta& meta);

// Collective. Loads `path` into this rank's parameters and, when the moment arenas are
// given (whole-arena, both or neither), the optimizer moments. InputError for a bad or
// mismatched checkpoint.
CheckpointMeta load_run_checkpoint(Session& s, const std::string& path, float* exp_avg,
                                   float* exp_avg_sq);

}  // namespace pptrain
