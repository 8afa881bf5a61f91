// GPU LayerNorm over the last dimension (nn/layernorm.h gives the math), one
// function over the storage format Y of its output. Device pointers;
// asynchronous on `stream`. One block per row; the parameter gradients are
// column sums taken in row order, so results do not depend on scheduling.
// eps is nn::kLayerNormEps (passed in: the .cu cannot include nn/layernorm.h,
// nvcc does not compile fmt).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"

namespace dtrain::nn::cuda {

// x: [n, c] f32; weight, bias: [c]; y: [n, c] in format Y (computed in f32);
// saves mean, rstd: [n] for backward; x_copy, when given, receives x in the
// same pass (nn::layernorm_forward).
template <DType Y>
void layernorm_forward(const float* x, const float* weight, const float* bias, Storage<Y>* y, float* mean,
                       float* rstd, std::int64_t n, std::int64_t c, float eps, float* x_copy, cudaStream_t stream);

// dy, x: [n, c]. dx: [n, c], written, or added to when accumulate_dx (dx must
// not alias dy). dweight, dbias: [c], always added to.
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean, const float* rstd,
                        float* dx, float* dweight, float* dbias, std::int64_t n, std::int64_t c, bool accumulate_dx,
                        cudaStream_t stream);

}  // namespace dtrain::nn::cuda
