// GPU residual adds and the elementwise helpers around them (the CPU loop in
// nn/transformer.cpp: x_mid = x + branch). Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::nn::cuda {

// out = x + branch, all [n]; out may alias x or branch.
void residual_forward(const float* x, const float* branch, float* out, std::int64_t n,
                      cudaStream_t stream);
// The residual's gradient flows to both inputs unchanged: d_x += d_out and
// d_branch = d_out are plain copies/adds, so backward is add_inplace.
// dst += src, both [n].
void add_inplace(float* dst, const float* src, std::int64_t n, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
