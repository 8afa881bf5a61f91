// AdamW (decoupled weight decay, bias correction) exactly as torch.optim.AdamW
// computes it, over contiguous ranges of the flat buffers, plus global
// gradient-norm clipping. Works on any slice, so a ZeRO shard updates only
// the range it owns.
#pragma once

#include <cstdint>
#include <span>

#include "nn/parameters.h"

namespace dtrain::nn {

struct AdamWHyper {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// The constants of one update, computed on the host as torch does (the bias
// corrections in double); every device's AdamW applies them per element.
struct AdamWConstants {
  float b1, b2, eps;
  float step_size;     // lr / (1 - b1^t)
  float inv_bc2_sqrt;  // 1 / sqrt(1 - b2^t)
  float decay;         // 1 - lr * weight_decay
  float grad_scale;
};
AdamWConstants adamw_constants(const AdamWHyper& hyper, float weight_decay, std::int64_t step, float grad_scale);

// One update of n elements at optimizer step `step` (1-based):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
// weight_decay is the effective value for this range (0 for biases and norms).
// g is grad * grad_scale: the clipping factor is applied here, in the same pass.
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n, const AdamWHyper& hyper, float weight_decay,
                  std::int64_t step, float grad_scale = 1.0f);

// Applies adamw_update to every parameter of the layout, with weight decay
// only where ParamSpec::decay is set. Buffers hold all blocks back to back.
void adamw_step(const ParameterLayout& layout, std::span<float> params,
                std::span<const float> grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale = 1.0f);

// Sum of squares (accumulated in double) of a gradient range.
double sum_of_squares(const float* x, std::int64_t n);

// torch.nn.utils.clip_grad_norm_: the factor is min(1, max_norm / (norm + 1e-6)),
// so it is already below 1 at norm == max_norm, as in torch; max_norm <= 0
// disables clipping (factor 1).
float clip_factor(double global_norm, float max_norm);
void scale(float* x, std::int64_t n, float factor);

}  // namespace dtrain::nn
