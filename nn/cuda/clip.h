// GPU global gradient-norm clipping (nn/adamw.h's sum_of_squares and
// clip_factor): the squared norm, the norm and the factor stay on the device,
// so clipping needs no host synchronisation. Device pointers; asynchronous on
// `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::nn::cuda {

// *sum_sq += sum of x[i]^2 over n: float partial sums over chunks of 1024 (as
// the CPU) added in double; chunks reach *sum_sq in no fixed order (atomics).
void sum_of_squares(const float* x, std::int64_t n, double* sum_sq, cudaStream_t stream);

// norm = sqrt(*sum_sq) (written to *norm when not null);
// *factor = min(1, max_norm / (norm + 1e-6)), 1 when max_norm <= 0 (torch's clip_grad_norm_).
void clip_factor(const double* sum_sq, float max_norm, float* factor, float* norm,
                 cudaStream_t stream);

// x *= *factor over n; no pass over memory when the factor is 1.
void scale(float* x, std::int64_t n, const float* factor, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
