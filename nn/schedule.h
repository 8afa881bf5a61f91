// Learning-rate schedule: linear warmup ((step + 1) / warmup_steps * lr), then
// cosine or linear decay that reaches lr * min_lr_ratio at step total_steps
// and stays there (the last update of a run, total_steps - 1, is one step
// short of it, as torch's CosineAnnealingLR), or constant lr.
#pragma once

#include <cstdint>

namespace dtrain::nn {

enum class Decay : std::uint8_t { cosine, linear, constant };

struct LrSchedule {
  float lr = 3e-4f;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  Decay decay = Decay::cosine;
  float min_lr_ratio = 0.1f;

  // Learning rate of 0-based step `step` (the update that makes it step + 1).
  float at(std::int64_t step) const;
};

}  // namespace dtrain::nn
