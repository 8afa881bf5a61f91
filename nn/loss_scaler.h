// Dynamic loss scaling for fp16 training, as torch.cuda.amp.GradScaler does
// it: the loss (hence every gradient) is multiplied by scale(); after
// backward, a step whose gradients hold an inf or NaN is skipped and the
// scale halves; after growth_interval consecutive clean steps it doubles.
// Disabled (bf16, fp32), the scale is 1 and no step is skipped.
// Not thread-safe; every rank keeps its own and feeds it the same verdicts
// (the non-finite test reads the globally reduced gradient norm).
#pragma once

#include <cstdint>

namespace dtrain::nn {

struct LossScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0;     // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

// What a checkpoint keeps.
struct LossScalerState {
  double scale = 1.0;
  std::int64_t good_steps = 0;  // consecutive clean steps since the last change
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  bool enabled() const { return options_.enabled; }
  // The factor the loss is multiplied by (1 when disabled).
  double scale() const { return state_.scale; }
  // Records one step's verdict; returns whether the optimizer step applies
  // (false: skip it). Always true when disabled.
  bool update(bool found_non_finite);

  LossScalerState state() const { return state_; }
  // REQUIRES: state.scale > 0 and finite. Ignored when disabled.
  void restore(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace dtrain::nn
