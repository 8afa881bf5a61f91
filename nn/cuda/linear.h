// GPU Linear layer, PyTorch convention (nn/linear.h gives the math): y = x W^T
// + b with W stored [out, in], every product through cuda::gemm (cuBLAS).
// Device pointers; asynchronous on `stream`; `blas` is used by this thread only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/matmul.h"

namespace dtrain::nn::cuda {

// x: [n, in], weight: [out, in], bias: [out] or null, y: [n, out].
// accumulate: y += x W^T + b instead of y = ... (adds a residual in place).
void linear_forward(Blas& blas, const float* x, const float* weight, const float* bias, float* y,
                    std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate,
                    cudaStream_t stream);

// dy: [n, out]. dx: [n, in] written (or added to when accumulate_dx); null skips it.
// dweight: [out, in] and dbias: [out] (may be null) are added to; dbias sums
// rows in a fixed order (no atomics).
void linear_backward(Blas& blas, const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx, cudaStream_t stream);

// sums[j] += sum over rows i of m[i, j]; m: [rows, cols]. The bias gradient.
void add_column_sums(const float* m, float* sums, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream);

}  // namespace dtrain::nn::cuda
