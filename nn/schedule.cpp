#include "nn/schedule.h"

#include <cmath>

namespace dtrain::nn {

float LrSchedule::at(std::int64_t step) const {
  if (step < warmup_steps) {
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  const double min_lr = static_cast<double>(lr) * min_lr_ratio;
  const std::int64_t span = total_steps - warmup_steps;
  double progress = span > 0 ? static_cast<double>(step - warmup_steps) / static_cast<double>(span) : 1.0;
  progress = progress > 1.0 ? 1.0 : progress;
  switch (decay) {
    case Decay::constant:
      return lr;
    case Decay::linear:
      return static_cast<float>(lr - (lr - min_lr) * progress);
    case Decay::cosine:
      break;
  }
  constexpr double kPi = 3.14159265358979323846;
  return static_cast<float>(min_lr + 0.5 * (1.0 + std::cos(kPi * progress)) * (lr - min_lr));
}

}  // namespace dtrain::nn
