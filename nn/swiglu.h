// SwiGLU, LLaMA's MLP activation: of the fused gate/up projection's output
// h = [gate | up] ([n, 2c]: the gate's c columns, then the up projection's),
//   a = silu(gate) * up,  silu(g) = g * sigmoid(g)
// which the down projection reads. Storage in format F; arithmetic in f32.
#pragma once

#include <cstdint>

#include "nn/cpu/convert.h"

namespace dtrain::nn {

// h: [n, 2c], rows ld_h apart (0: 2c); a: [n, c], rows ld_a apart (0: c),
// written. Columns past 2c (c) of a row are neither read nor written.
template <class F = cpu::F32Format>
void swiglu_forward(const typename F::T* h, typename F::T* a, std::int64_t n, std::int64_t c, std::int64_t ld_h = 0,
                    std::int64_t ld_a = 0);

// da: [n, c] (rows ld_a apart), h as forward's. d_h: [n, 2c] (rows ld_h
// apart), written: d_gate = da * up * silu'(gate), d_up = da * silu(gate).
// d_bias, when given: [2c], added to: d_h's column sums (f32, before
// rounding to F; rows in order), the bias gradient of the gate/up projection.
template <class F = cpu::F32Format>
void swiglu_backward(const typename F::T* da, const typename F::T* h, typename F::T* d_h, float* d_bias,
                     std::int64_t n, std::int64_t c, std::int64_t ld_a = 0, std::int64_t ld_h = 0);

}  // namespace dtrain::nn
