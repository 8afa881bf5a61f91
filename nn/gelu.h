// GELU with the exact erf form: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
// Forward also writes the derivative gelu'(x) = Phi(x) + x phi(x), which it
// gets almost for free from the same erf, so that backward is one multiply and
// the pre-activation need not be kept.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::nn {

// x, y, dydx: [n]. y = gelu(x); dydx = gelu'(x) (null skips it). dydx may
// alias x (the pre-activation is overwritten by its derivative); y may not.
void gelu_forward(const float* x, float* y, float* dydx, std::int64_t n);

// dx = dy * dydx, with dydx from gelu_forward. dy and dx may alias.
void gelu_backward(const float* dy, const float* dydx, float* dx, std::int64_t n);

// Mixed precision: the same on 16-bit storage (dtype bf16 or f16), computed
// in f32. dydx may alias x.
void gelu_forward_half(DType dtype, const std::uint16_t* x, std::uint16_t* y,
                       std::uint16_t* dydx, std::int64_t n);
// dy_dx = dy * dydx in place.
void gelu_backward_half(DType dtype, std::uint16_t* dy_dx, const std::uint16_t* dydx,
                        std::int64_t n);

}  // namespace dtrain::nn
