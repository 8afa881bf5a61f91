// Linear layer, PyTorch convention: y = x W^T + b with W stored [out, in].
// Every product goes through nn::cpu::gemm (oneDNN). Operands (x, W, dy) are
// stored in format FX (f32, or 16-bit with f32 accumulation); the output y or
// dx in format FY / FD (f32 or FX); biases and parameter gradients are f32.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "nn/cpu/convert.h"
#include "nn/cpu/matmul.h"

namespace dtrain::nn {

// The row strides, in elements, of a layer's activations: x and dx (`in`),
// y and dy (`out`); 0 or the width itself means dense rows. A kernel set
// gives an activation a wider row where its products read it faster that
// way (row_stride(): nn/graph.h).
struct LinearRows {
  std::int64_t in = 0, out = 0;
};

// The layer's three products as Gemm descriptions, for any element types
// (the caller sets a_type/b_type/c_type for 16-bit operands); the CPU runs
// them through cpu::gemm, the GPU through cuda::gemm.
// y[n, out] (+)= x[n, in] W^T[in, out]
cpu::Gemm linear_forward_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate,
                              LinearRows rows = {});
// dx[n, in] (+)= dy[n, out] W[out, in]
cpu::Gemm linear_input_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate,
                                 LinearRows rows = {});
// dW[out, in] += dy^T[out, n] x[n, in] (always accumulates)
cpu::Gemm linear_weight_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out, LinearRows rows = {});
// The same three with their element types set: operands FX, output FY.
cpu::Gemm typed(cpu::Gemm g, DType operands, DType output);

// x: [n, in], weight: [out, in], bias: [out] or null, y: [n, out].
// accumulate: y += x W^T + b instead of y = ... (used to add a residual in place).
// weights_version: the weight's version (nn/parameters.h, BlockPointers) for
// cpu::gemm_weights to read it in oneDNN's preferred layout; 0 reads it as stored.
// rows: x's and y's row strides (dense by default).
template <class FX = cpu::F32Format, class FY = FX>
void linear_forward(const typename FX::T* x, const typename FX::T* weight, const float* bias,
                    typename FY::T* y, std::int64_t n, std::int64_t in, std::int64_t out,
                    bool accumulate = false, std::uint64_t weights_version = 0, LinearRows rows = {});

// dy: [n, out]. dx: [n, in] written (or added to when accumulate_dx); null skips it.
// dweight: [out, in] and dbias: [out] (may be null) are added to. dbias sums
// dy_f32 when given (the same gradient before it was rounded to FX), else dy.
// weights_version: as for linear_forward (dx's product; dweight stays plain).
// rows: the row strides of x and dx (in), dy and dy_f32 (out).
template <class FX = cpu::F32Format, class FD = FX>
void linear_backward(const typename FX::T* dy, const typename FX::T* x, const typename FX::T* weight,
                     typename FD::T* dx, float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx = false, const float* dy_f32 = nullptr,
                     std::uint64_t weights_version = 0, LinearRows rows = {});

}  // namespace dtrain::nn
