// The config's precision and parallel.reduce_dtype, as the element types the
// engine and the model use (values were checked by validate_config).
//   fp32  f32 everywhere
//   bf16  bf16 compute copies, activations and matmuls; f32 masters, moments, gradients
//   fp16  the same in f16, with dynamic loss scaling (nn/loss_scaler.h)
#pragma once

#include <string>

#include "core/dtype.h"
#include "nn/loss_scaler.h"
#include "proto/config.pb.h"

namespace dtrain::worker {

inline DType precision_dtype(const std::string& name) {
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::f16;
  return DType::f32;
}

inline DType compute_dtype(const config::Config& c) { return precision_dtype(c.precision()); }

inline DType reduce_dtype(const config::Config& c) {
  return precision_dtype(c.parallel().reduce_dtype());
}

inline nn::LossScalerOptions loss_scaling(const config::Config& c) {
  nn::LossScalerOptions o;
  o.enabled = c.precision() == "fp16";
  return o;
}

}  // namespace dtrain::worker
