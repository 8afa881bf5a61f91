// GPU LayerNorm over the last dimension, eps nn::kLayerNormEps (nn/layernorm.h
// gives the math). Device pointers; asynchronous on `stream`. One block per
// row; the parameter gradients are column sums taken in row order, so results
// do not depend on scheduling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::nn::cuda {

// x, y: [n, c]; weight, bias: [c]; saves mean, rstd: [n] for backward.
void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                       float* mean, float* rstd, std::int64_t n, std::int64_t c,
                       cudaStream_t stream);

// The same with y stored in y_type (bf16 or f16); mean and rstd stay f32.
void layernorm_forward_half(const float* x, const float* weight, const float* bias,
                            std::uint16_t* y, DType y_type, float* mean, float* rstd,
                            std::int64_t n, std::int64_t c, cudaStream_t stream);

// dy, x: [n, c]. dx: [n, c], written, or added to when accumulate_dx.
// dweight, dbias: [c], always added to.
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, float* dx, float* dweight, float* dbias, std::int64_t n,
                        std::int64_t c, bool accumulate_dx, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
