// Learning-rate schedules: linear warmup, then cosine, linear or constant decay.
#pragma once
#include <cstdint>

#include "config/config.hpp"

namespace pptrain {

// Learning rate for 0-based step `step`: linear warmup lr*(step+1)/warmup_steps for
// step < warmup_steps, then decay from lr to min_lr over the remaining steps
// (progress = (step - warmup) / max(1, steps - warmup), clamped to [0,1]):
// cosine: min_lr + 0.5*(1+cos(pi*progress))*(lr-min_lr); linear: lr + progress*(min_lr-lr);
// constant: lr.
double learning_rate(const TrainConfig& train, int64_t step);

}  // namespace pptrain
