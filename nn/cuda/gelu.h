// GPU GELU, exact erf form (nn/gelu.h gives the math), computed with the CPU's
// erf/exp approximations so both devices agree element for element. Device
// pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::nn::cuda {

// x, y, dydx: [n]. y = gelu(x); dydx = gelu'(x) (null skips it); dydx may alias x.
void gelu_forward(const float* x, float* y, float* dydx, std::int64_t n, cudaStream_t stream);
// dx = dy * dydx; dy and dx may alias.
void gelu_backward(const float* dy, const float* dydx, float* dx, std::int64_t n,
                   cudaStream_t stream);

// The same on 16-bit storage (dtype bf16 or f16), computed in f32.
void gelu_forward_half(DType dtype, const std::uint16_t* x, std::uint16_t* y, std::uint16_t* dydx,
                       std::int64_t n, cudaStream_t stream);
// dy_dx = dy * dydx in place.
void gelu_backward_half(DType dtype, std::uint16_t* dy_dx, const std::uint16_t* dydx,
                        std::int64_t n, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
