// GPU residual add (the CPU kernel set's residual: out = x + branch), also
// the device's add (dst += src). Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::nn::cuda {

// out = x + branch, all [n]; out may alias x or branch.
void residual(const float* x, const float* branch, float* out, std::int64_t n, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
