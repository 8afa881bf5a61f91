// The GPU Linear layer's own kernel: the bias gradient as column sums of the
// output gradient, read in its storage format (16-bit rows widened as they
// are read, so no f32 copy is needed), rows in a fixed order (no atomics).
// The layer's products (nn/linear.h) run through cuda::gemm in the kernel set
// (cuda_kernels.h). Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"

namespace dtrain::nn::cuda {

// sums[j] += the sum over rows i of m[i, j] widened to f32; m: [rows, cols] in format D.
template <DType D>
void add_column_sums(const Storage<D>* m, float* sums, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
