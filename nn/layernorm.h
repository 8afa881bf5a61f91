// LayerNorm over the last dimension (eps 1e-5 unless given), as torch.nn.LayerNorm.
#pragma once

#include <cstdint>

#include "nn/cpu/convert.h"

namespace dtrain::nn {

inline constexpr float kLayerNormEps = 1e-5f;

// x: [n, c] f32; weight, bias: [c]; y: [n, c] stored in format F (f32, or
// 16-bit for the matmul that reads it; computed in f32); saves mean, rstd:
// [n] for backward. x_copy, when given, receives x in the same pass: the
// residual stream that the GEMM after this norm adds its branch into (so no
// separate pass reads x again to copy it). eps: added to the variance (a
// model's config may set another, e.g. a checkpoint trained with 1e-6).
template <class F = cpu::F32Format>
void layernorm_forward(const float* x, const float* weight, const float* bias, typename F::T* y,
                       float* mean, float* rstd, std::int64_t n, std::int64_t c, float* x_copy = nullptr,
                       float eps = kLayerNormEps);

// dy, x: [n, c]. dx: [n, c], written, or added to when accumulate_dx.
// dweight, dbias: [c], always added to. dx_sums, when given: [c], written
// with the column sums of dx as this pass leaves it, added row by row in
// order from 0 (the order of linear_backward's bias sum): the bias gradient
// of the branch that reads dx next, without another pass over it.
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, float* dx, float* dweight, float* dbias,
                        std::int64_t n, std::int64_t c, bool accumulate_dx, float* dx_sums = nullptr);

}  // namespace dtrain::nn
