// Learning-rate schedules (see lr_schedule.hpp for the formulas).
#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"

namespace pptrain {

double learning_rate(const TrainConfig& train, int64_t step) {
  const int64_t warmup = std::max(0, train.warmup_steps);
  if (step < warmup) return train.lr * double(step + 1) / double(warmup);

  const double span = double(std::max<int64_t>(1, int64_t(train.steps) - warmup));
  const double progress = std::clamp(double(step - warmup) / span, 0.0, 1.0);
  switch (train.lr_schedule) {
    case LrSchedule::Cosine:
      return train.min_lr +
             0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (train.lr - train.min_lr);
    case LrSchedule::Linear: return train.lr + progress * (train.min_lr - train.lr);
    case LrSchedule::Constant: return train.lr;
  }
  return train.lr;
}

}  // namespace pptrain
