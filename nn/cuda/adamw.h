// GPU AdamW, fp32 parameters and state (nn/adamw.h gives the math): the same
// update order, bias correction and decoupled weight decay as the CPU, over any
// contiguous range, so a ZeRO shard updates only what it owns. Device pointers;
// asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/adamw.h"

namespace dtrain::nn::cuda {

// One update of n elements at optimizer step `step` (1-based, known on the
// host, which computes the bias corrections as the CPU does). The gradient
// used is grad * grad_scale * (*device_scale when not null): device_scale is a
// factor computed on the device (clip_factor below) that the host never reads.
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n, const AdamWHyper& hyper, float weight_decay, std::int64_t step,
                  float grad_scale, const float* device_scale, cudaStream_t stream);

// adamw_update over every parameter of the layout, weight decay only where
// ParamSpec::decay is set; buffers hold all blocks back to back (one launch
// per parameter).
void adamw_step(const ParameterLayout& layout, float* params, const float* grads, float* exp_avg,
                float* exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                const float* device_scale, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
