// Linear layer, PyTorch convention: y = x W^T + b with W stored [out, in].
// Every product goes through nn::cpu::gemm (oneDNN).
#pragma once

#include <cstdint>

namespace dtrain::nn {

// x: [n, in], weight: [out, in], bias: [out] or null, y: [n, out].
// accumulate: y += x W^T + b instead of y = ... (used to add a residual in place).
void linear_forward(const float* x, const float* weight, const float* bias, float* y,
                    std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate = false);

// dy: [n, out]. dx: [n, in] written (or added to when accumulate_dx); null skips it.
// dweight: [out, in] and dbias: [out] (may be null) are added to.
void linear_backward(const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx = false);

}  // namespace dtrain::nn
