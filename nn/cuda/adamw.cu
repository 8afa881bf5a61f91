#include <cmath>

#include "nn/cuda/adamw.h"
#include "nn/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

struct AdamWConstants {
  float b1, b2, eps, step_size, inv_bc2_sqrt, decay, grad_scale;
};

// The CPU's float arithmetic, op for op (__f*_rn: no FMA contraction).
__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                             std::int64_t n, AdamWConstants k, const float* device_scale) {
  const float scale =
      device_scale != nullptr ? __fmul_rn(k.grad_scale, *device_scale) : k.grad_scale;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float g = __fmul_rn(grad[i], scale);
    const float m = __fadd_rn(__fmul_rn(k.b1, exp_avg[i]), __fmul_rn(1.0f - k.b1, g));
    const float v =
        __fadd_rn(__fmul_rn(k.b2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(1.0f - k.b2, g), g));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), k.inv_bc2_sqrt), k.eps);
    param[i] = __fsub_rn(__fmul_rn(param[i], k.decay), __fdiv_rn(__fmul_rn(k.step_size, m), denom));
  }
}

AdamWConstants constants(const AdamWHyper& hyper, float weight_decay, std::int64_t step,
                         float grad_scale) {
  const double t = static_cast<double>(step);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(hyper.beta1, t));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(hyper.beta2, t));
  return AdamWConstants{hyper.beta1,
                        hyper.beta2,
                        hyper.eps,
                        hyper.lr / bias_correction1,
                        1.0f / std::sqrt(bias_correction2),
                        1.0f - hyper.lr * weight_decay,
                        grad_scale};
}

}  // namespace

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n, const AdamWHyper& hyper, float weight_decay, std::int64_t step,
                  float grad_scale, const float* device_scale, cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(step >= 1, "adamw: step is 1-based");
  if (n == 0) return;
  adamw_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
      param, grad, exp_avg, exp_avg_sq, n, constants(hyper, weight_decay, step, grad_scale),
      device_scale);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void adamw_step(const ParameterLayout& layout, float* params, const float* grads, float* exp_avg,
                float* exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                const float* device_scale, cudaStream_t stream) {
  for (const ParamSpec& p : layout.params()) {
    const std::int64_t off = layout.block_offset(p.block) + p.offset;
    adamw_update(params + off, grads + off, exp_avg + off, exp_avg_sq + off, p.numel, hyper,
                 p.decay ? hyper.weight_decay : 0.0f, step, 1.0f, device_scale, stream);
  }
}

}  // namespace dtrain::nn::cuda
