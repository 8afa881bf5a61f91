// GPU inverted dropout with the CPU's counter-based mask (nn/dropout.h):
// element i of a call with key k is kept iff the top 32 bits of
// splitmix64(k + i) >= p * 2^32, so both devices drop exactly the same
// elements for the same key (nn::dropout_key derives it on the host).
// Device pointer; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::nn::cuda {

// x[i] = kept ? x[i] / (1 - p) : 0, n elements; p == 0 leaves x untouched.
// Forward on activations and backward on their gradients, with the same key.
void dropout_apply(float* x, std::int64_t n, float p, std::uint64_t key, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
