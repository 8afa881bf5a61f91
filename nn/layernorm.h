// LayerNorm over the last dimension (eps 1e-5), as torch.nn.LayerNorm.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::nn {

inline constexpr float kLayerNormEps = 1e-5f;

// x, y: [n, c]; weight, bias: [c]; saves mean, rstd: [n] for backward.
void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                       float* mean, float* rstd, std::int64_t n, std::int64_t c);

// Mixed precision: the same in f32, y stored in y_type (bf16 or f16) for the
// matmul that reads it; mean and rstd stay f32.
void layernorm_forward_half(const float* x, const float* weight, const float* bias,
                            std::uint16_t* y, DType y_type, float* mean, float* rstd,
                            std::int64_t n, std::int64_t c);

// dy, x: [n, c]. dx: [n, c], written, or added to when accumulate_dx.
// dweight, dbias: [c], always added to.
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, float* dx, float* dweight, float* dbias,
                        std::int64_t n, std::int64_t c, bool accumulate_dx);

}  // namespace dtrain::nn
