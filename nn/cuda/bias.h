// Bias broadcast over the rows of a (batched, strided) row-major matrix: the
// bias part of cuda::gemm's fallback path (nn/cuda/matmul.h), which then adds
// the product with beta = 1. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::nn::cuda {

// For every item i < batch, row r < m: c[i*stride_c + r*ldc + (0..n)] = bias[0..n]
// (or += when accumulate). c holds c_type elements; bias is f32.
// REQUIRES: c_type is f32, bf16 or f16 (cuda::gemm checked it).
void broadcast_bias(const float* bias, void* c, DType c_type, std::int64_t m, std::int64_t n,
                    std::int64_t ldc, std::int64_t stride_c, std::int64_t batch, bool accumulate,
                    cudaStream_t stream);

}  // namespace dtrain::nn::cuda
