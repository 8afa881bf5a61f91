#include "nn/linear.h"

#include "nn/cpu/convert.h"
#include "nn/cpu/matmul.h"

namespace dtrain::nn {

using cpu::Gemm;

void linear_forward(const float* x, const float* weight, const float* bias, float* y,
                    std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate) {
  Gemm g;
  g.m = n;
  g.n = out;
  g.k = in;
  g.trans_b = true;
  g.accumulate = accumulate;
  cpu::gemm(g, x, weight, y, bias);
}

void linear_backward(const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx) {
  if (dx != nullptr) {  // dx[n, in] = dy[n, out] W[out, in]
    Gemm g;
    g.m = n;
    g.n = in;
    g.k = out;
    g.accumulate = accumulate_dx;
    cpu::gemm(g, dy, weight, dx);
  }
  {  // dW[out, in] += dy^T[out, n] x[n, in]
    Gemm g;
    g.m = out;
    g.n = in;
    g.k = n;
    g.trans_a = true;
    g.accumulate = true;
    cpu::gemm(g, dy, x, dweight);
  }
  if (dbias != nullptr) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float* row = dy + i * out;
      for (std::int64_t j = 0; j < out; ++j) dbias[j] += row[j];
    }
  }
}

void linear_forward_half(DType dtype, const std::uint16_t* x, const std::uint16_t* weight,
                         const float* bias, void* y, DType y_type, std::int64_t n,
                         std::int64_t in, std::int64_t out, bool accumulate) {
  Gemm g;
  g.m = n;
  g.n = out;
  g.k = in;
  g.trans_b = true;
  g.accumulate = accumulate;
  g.a_type = g.b_type = dtype;
  g.c_type = y_type;
  cpu::gemm(g, static_cast<const void*>(x), weight, y, bias);
}

void linear_backward_half(DType dtype, const std::uint16_t* dy, const float* dy_f32,
                          const std::uint16_t* x, const std::uint16_t* weight, void* dx,
                          DType dx_type, float* dweight, float* dbias, std::int64_t n,
                          std::int64_t in, std::int64_t out, bool accumulate_dx) {
  if (dx != nullptr) {  // dx[n, in] = dy[n, out] W[out, in]
    Gemm g;
    g.m = n;
    g.n = in;
    g.k = out;
    g.accumulate = accumulate_dx;
    g.a_type = g.b_type = dtype;
    g.c_type = dx_type;
    cpu::gemm(g, static_cast<const void*>(dy), weight, dx);
  }
  {  // dW[out, in] += dy^T[out, n] x[n, in], accumulated in f32
    Gemm g;
    g.m = out;
    g.n = in;
    g.k = n;
    g.trans_a = true;
    g.accumulate = true;
    g.a_type = g.b_type = dtype;
    cpu::gemm(g, static_cast<const void*>(dy), x, dweight);
  }
  if (dbias == nullptr) return;
  if (dy_f32 != nullptr) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float* row = dy_f32 + i * out;
      for (std::int64_t j = 0; j < out; ++j) dbias[j] += row[j];
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) cpu::add_half_to_f32(dy + i * out, dtype, dbias, out);
}

}  // namespace dtrain::nn
