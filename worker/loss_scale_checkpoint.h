// The fp16 loss scaler's state in a checkpoint manifest (loss_scale,
// loss_scale_good_steps). A run that does not scale leaves both 0, and a
// resumed run that scales keeps its initial scale unless the checkpoint has
// one, so checkpoints resume across precisions.
#pragma once

#include "proto/checkpoint.pb.h"
#include "sharding/engine.h"

namespace dtrain::worker {

inline void save_loss_scale(const sharding::Engine& engine, checkpoint::Manifest& manifest) {
  if (!engine.loss_scaler().enabled()) return;
  const nn::LossScalerState s = engine.loss_scaler().state();
  manifest.set_loss_scale(s.scale);
  manifest.set_loss_scale_good_steps(s.good_steps);
}

inline void restore_loss_scale(const checkpoint::Manifest& manifest, sharding::Engine& engine) {
  if (manifest.loss_scale() <= 0.0) return;
  engine.loss_scaler().restore({manifest.loss_scale(), manifest.loss_scale_good_steps()});
}

}  // namespace dtrain::worker
