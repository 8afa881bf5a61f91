// GPU RMSNorm over the last dimension (nn/rmsnorm.h gives the math), one
// function over the storage format Y of its output. Device pointers;
// asynchronous on `stream`. One block per row; the weight's gradient is a
// column sum taken in row order, so results do not depend on scheduling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"

namespace dtrain::nn::cuda {

// x: [n, c] f32; weight: [c]; y: [n, c] in format Y (computed in f32);
// saves rstd: [n] (1 / sqrt(mean(x^2) + eps)) for backward; x_copy, when
// given, receives x in the same pass (nn::rmsnorm_forward).
template <DType Y>
void rmsnorm_forward(const float* x, const float* weight, Storage<Y>* y, float* rstd, std::int64_t n, std::int64_t c,
                     float eps, float* x_copy, cudaStream_t stream);

// dy, x: [n, c]. dx: [n, c], written, or added to when accumulate_dx (dx must
// not alias dy). dweight: [c], always added to.
//   dx = rstd * (dy * w - x * rstd^2 * mean(dy * w * x))
void rmsnorm_backward(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                      float* dweight, std::int64_t n, std::int64_t c, bool accumulate_dx, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
