// Linear layer, PyTorch convention: y = x W^T + b with W stored [out, in].
// Every product goes through nn::cpu::gemm (oneDNN).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "nn/cpu/matmul.h"

namespace dtrain::nn {

// The layer's three products as Gemm descriptions, for any element types
// (the caller sets a_type/b_type/c_type for 16-bit operands); the CPU runs
// them through cpu::gemm, the GPU through cuda::gemm.
// y[n, out] (+)= x[n, in] W^T[in, out]
cpu::Gemm linear_forward_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate);
// dx[n, in] (+)= dy[n, out] W[out, in]
cpu::Gemm linear_input_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate);
// dW[out, in] += dy^T[out, n] x[n, in] (always accumulates)
cpu::Gemm linear_weight_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out);

// x: [n, in], weight: [out, in], bias: [out] or null, y: [n, out].
// accumulate: y += x W^T + b instead of y = ... (used to add a residual in place).
void linear_forward(const float* x, const float* weight, const float* bias, float* y,
                    std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate = false);

// dy: [n, out]. dx: [n, in] written (or added to when accumulate_dx); null skips it.
// dweight: [out, in] and dbias: [out] (may be null) are added to.
void linear_backward(const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx = false);

// Mixed precision: x, weight (and dy) are 16-bit (dtype bf16 or f16), products
// accumulate in f32 (oneDNN), bias is f32. y / dx are stored in y_type /
// dx_type (f32 or dtype); dweight and dbias are f32 and added to. dbias sums
// dy_f32 when given (the same gradient before rounding), else dy.
void linear_forward_half(DType dtype, const std::uint16_t* x, const std::uint16_t* weight,
                         const float* bias, void* y, DType y_type, std::int64_t n,
                         std::int64_t in, std::int64_t out, bool accumulate = false);

void linear_backward_half(DType dtype, const std::uint16_t* dy, const float* dy_f32,
                          const std::uint16_t* x, const std::uint16_t* weight, void* dx,
                          DType dx_type, float* dweight, float* dbias, std::int64_t n,
                          std::int64_t in, std::int64_t out, bool accumulate_dx = false);

}  // namespace dtrain::nn
