// GPU conversions between f32 and the storage formats (nn/cpu/convert.h):
// round to nearest even, NaN stays NaN, overflow becomes inf. The kernel
// set's to_storage, the device's to_half/to_f32 (compute copies, 16-bit
// gradient communication). Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"

namespace dtrain::nn::cuda {

// dst[i] = src[i] rounded to format D (f32: copied), n elements.
template <DType D>
void to_format(const float* src, Storage<D>* dst, std::int64_t n, cudaStream_t stream);
// dst[i] = src[i] widened to f32 (exact), or dst[i] += it when accumulate.
template <DType D>
void widen(const Storage<D>* src, float* dst, std::int64_t n, bool accumulate, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
