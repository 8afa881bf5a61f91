// RMSNorm over the last dimension, as LLaMA's (and torch.nn.RMSNorm with a
// weight): y = x / sqrt(mean(x^2) + eps) * weight. No mean is taken and
// there is no bias. Arithmetic in f32; the output in storage format F.
#pragma once

#include <cstdint>

#include "nn/cpu/convert.h"

namespace dtrain::nn {

// x: [n, c] f32; weight: [c]; y: [n, c] in format F (computed in f32);
// saves rstd: [n] (1 / sqrt(mean(x^2) + eps)) for backward. x_copy, when
// given, receives x in the same pass (as layernorm_forward's).
template <class F = cpu::F32Format>
void rmsnorm_forward(const float* x, const float* weight, typename F::T* y, float* rstd, std::int64_t n,
                     std::int64_t c, float eps, float* x_copy = nullptr);

// dy, x: [n, c] f32. dx: [n, c], written, or added to when accumulate_dx (dx
// must not alias dy). dweight: [c], always added to (column sums in row
// order from 0, so the result does not depend on the thread count).
//   dx = rstd * (dy * w - x * rstd^2 * mean(dy * w * x))
void rmsnorm_backward(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                      float* dweight, std::int64_t n, std::int64_t c, bool accumulate_dx);

}  // namespace dtrain::nn
