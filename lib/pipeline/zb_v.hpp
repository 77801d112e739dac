// ZB-V's compute order (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241):
// found by list-scheduling every stage together for the planned F, B and W times, rather
// than written out as a fixed pattern. schedule.cpp adds the messages.
#pragma once
#include <vector>

#include "pipeline/schedule.hpp"

namespace pptrain {

// Most chunk activation sets a zb-v stage holds (F done, W not yet): 2 * pp sets of half
// a stage's layers, the memory of 1F1B's first stage.
int zb_v_set_limit(int pp);

// Forward, BackwardInput and BackwardWeight actions of each stage 0..pp-1, in order, for
// two chunks in a V placement, planned for the relative F, B and W times `planned`.
// std::invalid_argument if pp or micro_batches < 1 or a time is not > 0.
std::vector<std::vector<Action>> zb_v_compute_order(int pp, int micro_batches,
                                                    const StageCosts& planned = {});

}  // namespace pptrain
