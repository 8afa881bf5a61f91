#include "nn/loss_scaler.h"

#include <cmath>

#include "core/error.h"

namespace dtrain::nn {

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  DTRAIN_CHECK(options.init_scale > 0.0 && options.growth_factor > 1.0 &&
                   options.backoff_factor > 0.0 && options.backoff_factor < 1.0 &&
                   options.growth_interval > 0,
               "invalid loss scaler options");
  state_.scale = options.enabled ? options.init_scale : 1.0;
}

bool LossScaler::update(bool found_non_finite) {
  if (!options_.enabled) return true;
  if (found_non_finite) {
    state_.scale *= options_.backoff_factor;
    state_.good_steps = 0;
    return false;
  }
  if (++state_.good_steps >= options_.growth_interval) {
    // GradScaler keeps the scale when growing would overflow f32.
    const double grown = state_.scale * options_.growth_factor;
    if (std::isfinite(static_cast<float>(grown))) state_.scale = grown;
    state_.good_steps = 0;
  }
  return true;
}

void LossScaler::restore(const LossScalerState& state) {
  if (!options_.enabled) return;
  DTRAIN_CHECK(state.scale > 0.0 && std::isfinite(state.scale), "loss scale {} is not positive",
               state.scale);
  state_ = state;
}

}  // namespace dtrain::nn
