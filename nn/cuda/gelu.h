// GPU GELU, the exact erf form or GPT-2's tanh approximation (nn/gelu.h and
// nn/gelu_form.h give the math), computed with the CPU's erf/exp
// approximations and operations so both devices agree element for element;
// one function over the storage format D (arithmetic in f32). Device
// pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"
#include "nn/gelu_form.h"

namespace dtrain::nn::cuda {

// x, y, dydx: [n]. y = gelu(x); dydx = gelu'(x) (null skips it); dydx may
// alias x, y may not.
template <DType D>
void gelu_forward(const Storage<D>* x, Storage<D>* y, Storage<D>* dydx, std::int64_t n, GeluForm form,
                  cudaStream_t stream);

// dy, dydx, dx: [n, c]. dx = dy * dydx; dx may alias dy. dbias: [c] or null;
// when given, the column sums of dx (f32, before rounding to D) are added to
// it in the same kernel, rows in a fixed order (no atomics).
template <DType D>
void gelu_backward(const Storage<D>* dy, const Storage<D>* dydx, Storage<D>* dx, float* dbias, std::int64_t n,
                   std::int64_t c, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
