// GELU with the exact erf form: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
#pragma once

#include <cstdint>

namespace dtrain::nn {

// x, y: [n] (may alias).
void gelu_forward(const float* x, float* y, std::int64_t n);

// dx = dy * gelu'(x), gelu'(x) = Phi(x) + x phi(x). dy and dx may alias.
void gelu_backward(const float* dy, const float* x, float* dx, std::int64_t n);

}  // namespace dtrain::nn
