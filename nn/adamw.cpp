#include "nn/adamw.h"

#include <cmath>

#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

AdamWConstants adamw_constants(const AdamWHyper& hyper, float weight_decay, std::int64_t step, float grad_scale) {
  const double t = static_cast<double>(step);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(hyper.beta1, t));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(hyper.beta2, t));
  return AdamWConstants{.b1 = hyper.beta1,
                        .b2 = hyper.beta2,
                        .eps = hyper.eps,
                        .step_size = hyper.lr / bias_correction1,
                        .inv_bc2_sqrt = 1.0f / std::sqrt(bias_correction2),
                        .decay = 1.0f - hyper.lr * weight_decay,
                        .grad_scale = grad_scale};
}

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n, const AdamWHyper& hyper, float weight_decay,
                  std::int64_t step, float grad_scale) {
  const AdamWConstants k = adamw_constants(hyper, weight_decay, step, grad_scale);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * k.grad_scale;
    const float m = k.b1 * exp_avg[i] + (1.0f - k.b1) * g;
    const float v = k.b2 * exp_avg_sq[i] + (1.0f - k.b2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) * k.inv_bc2_sqrt + k.eps;
    param[i] = param[i] * k.decay - k.step_size * m / denom;
  }
}

void adamw_step(const ParameterLayout& layout, std::span<float> params,
                std::span<const float> grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale) {
  for (const ParamSpec& p : layout.params()) {
    const std::int64_t off = layout.block_offset(p.block) + p.offset;
    adamw_update(params.data() + off, grads.data() + off, exp_avg.data() + off,
                 exp_avg_sq.data() + off, p.numel, hyper, p.decay ? hyper.weight_decay : 0.0f,
                 step, grad_scale);
  }
}

double sum_of_squares(const float* x, std::int64_t n) {
  // Float partial sums over chunks, each in SIMD lanes; chunks add in double.
  constexpr std::int64_t kChunk = 1024;
  double total = 0.0;
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const float* chunk = x + c;
    cpu::LaneSums partial;
    partial.add(c + kChunk < n ? kChunk : n - c, [&](auto at) { return at(chunk) * at(chunk); });
    total += partial.total();
  }
  return total;
}

float clip_factor(double global_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (global_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

void scale(float* x, std::int64_t n, float factor) {
  if (factor == 1.0f) return;
  for (std::int64_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace dtrain::nn
