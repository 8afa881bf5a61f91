// GPU SwiGLU (nn/swiglu.h gives the math): a = silu(gate) * up of the fused
// gate/up projection's output h = [gate | up], one function over the
// storage format D (arithmetic in f32). Device pointers; asynchronous on
// `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"

namespace dtrain::nn::cuda {

// h: [n, 2c], rows ld_h apart (0: 2c); a: [n, c], rows ld_a apart (0: c),
// written. Columns past 2c (c) of a row are neither read nor written.
template <DType D>
void swiglu_forward(const Storage<D>* h, Storage<D>* a, std::int64_t n, std::int64_t c, std::int64_t ld_h,
                    std::int64_t ld_a, cudaStream_t stream);

// da: [n, c] (rows ld_a apart), h as forward's. d_h: [n, 2c] (rows ld_h
// apart), written: d_gate = da * up * silu'(gate), d_up = da * silu(gate).
// d_bias, when given: [2c], added to: d_h's column sums (f32, before
// rounding to D), rows in a fixed order (no atomics).
template <DType D>
void swiglu_backward(const Storage<D>* da, const Storage<D>* h, Storage<D>* d_h, float* d_bias, std::int64_t n,
                     std::int64_t c, std::int64_t ld_a, std::int64_t ld_h, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
