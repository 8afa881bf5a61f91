#include "nn/linear.h"

#include "nn/cpu/convert.h"
#include "nn/cpu/matmul.h"

namespace dtrain::nn {

using cpu::Gemm;

namespace {

// dbias[out] += the sum of dy's n rows.
void add_rows(const float* dy, std::int64_t n, std::int64_t out, float* dbias) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = dy + i * out;
    for (std::int64_t j = 0; j < out; ++j) dbias[j] += row[j];
  }
}

}  // namespace

// y[n, out] (+)= x[n, in] W^T[in, out]
Gemm linear_forward_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate) {
  Gemm g;
  g.m = n;
  g.n = out;
  g.k = in;
  g.trans_b = true;
  g.accumulate = accumulate;
  return g;
}

// dx[n, in] (+)= dy[n, out] W[out, in]
Gemm linear_input_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate) {
  Gemm g;
  g.m = n;
  g.n = in;
  g.k = out;
  g.accumulate = accumulate;
  return g;
}

// dW[out, in] += dy^T[out, n] x[n, in]
Gemm linear_weight_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out) {
  Gemm g;
  g.m = out;
  g.n = in;
  g.k = n;
  g.trans_a = true;
  g.accumulate = true;
  return g;
}

void linear_forward(const float* x, const float* weight, const float* bias, float* y,
                    std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate) {
  cpu::gemm(linear_forward_gemm(n, in, out, accumulate), x, weight, y, bias);
}

void linear_backward(const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx) {
  if (dx != nullptr) cpu::gemm(linear_input_grad_gemm(n, in, out, accumulate_dx), dy, weight, dx);
  cpu::gemm(linear_weight_grad_gemm(n, in, out), dy, x, dweight);
  if (dbias != nullptr) add_rows(dy, n, out, dbias);
}

void linear_forward_half(DType dtype, const std::uint16_t* x, const std::uint16_t* weight,
                         const float* bias, void* y, DType y_type, std::int64_t n,
                         std::int64_t in, std::int64_t out, bool accumulate) {
  Gemm g = linear_forward_gemm(n, in, out, accumulate);
  g.a_type = g.b_type = dtype;
  g.c_type = y_type;
  cpu::gemm(g, static_cast<const void*>(x), weight, y, bias);
}

void linear_backward_half(DType dtype, const std::uint16_t* dy, const float* dy_f32,
                          const std::uint16_t* x, const std::uint16_t* weight, void* dx,
                          DType dx_type, float* dweight, float* dbias, std::int64_t n,
                          std::int64_t in, std::int64_t out, bool accumulate_dx) {
  if (dx != nullptr) {
    Gemm g = linear_input_grad_gemm(n, in, out, accumulate_dx);
    g.a_type = g.b_type = dtype;
    g.c_type = dx_type;
    cpu::gemm(g, static_cast<const void*>(dy), weight, dx);
  }
  Gemm w = linear_weight_grad_gemm(n, in, out);
  w.a_type = w.b_type = dtype;
  cpu::gemm(w, static_cast<const void*>(dy), x, dweight);
  if (dbias == nullptr) return;
  if (dy_f32 != nullptr) {
    add_rows(dy_f32, n, out, dbias);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) cpu::add_half_to_f32(dy + i * out, dtype, dbias, out);
}

}  // namespace dtrain::nn
