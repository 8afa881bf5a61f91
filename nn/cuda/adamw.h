// The device's AdamW and gradient norm on the GPU (nn/adamw.h gives the
// math): fp32 parameters and state, the CPU's update order over any
// contiguous range (a ZeRO shard updates only what it owns), with the
// constants nn::adamw_constants computes on the host. Device pointers;
// asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/adamw.h"

namespace dtrain::nn::cuda {

// One update of n elements (nn::adamw_update): g = grad * k.grad_scale, then
// the moments and the parameter, float operations in the CPU's order.
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                  const AdamWConstants& k, cudaStream_t stream);

// *total += sum of x[i]^2 over n (nn::sum_of_squares): float partial sums over
// chunks of 1024, as the CPU (each chunk summed in its own order), added in
// double; total is device memory and the chunks reach it in no fixed order
// (atomics).
void sum_of_squares(const float* x, std::int64_t n, double* total, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
