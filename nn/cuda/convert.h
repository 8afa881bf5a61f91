// GPU conversions between f32 and the 16-bit float formats (nn/cpu/convert.h):
// round to nearest even, NaN stays NaN, overflow becomes inf. Used for the
// compute copies of mixed precision. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::nn::cuda {

// dst[i] = round(src[i]) in dtype (bf16 or f16), n elements.
void f32_to_half(const float* src, DType dtype, std::uint16_t* dst, std::int64_t n,
                 cudaStream_t stream);
// dst[i] = src[i] widened to f32 (exact).
void half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n,
                 cudaStream_t stream);

}  // namespace dtrain::nn::cuda
