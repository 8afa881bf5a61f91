#include "nn/linear.h"

#include "nn/cpu/kernel_profile.h"
#include "nn/cpu/matmul.h"

namespace dtrain::nn {

using cpu::Gemm;

namespace {

// dbias[out] += the sum of dy's n rows, ld apart (widened from format F).
template <class F>
void add_rows(const typename F::T* dy, std::int64_t n, std::int64_t out, std::int64_t ld, float* dbias) {
  const double bytes = static_cast<double>(n * out) * sizeof(typename F::T) + 8.0 * static_cast<double>(out);
  const cpu::KernelTimer timer(cpu::KernelKind::bias_grad, bytes);  // dy read, dbias updated
  for (std::int64_t i = 0; i < n; ++i) {
    const typename F::T* row = dy + i * ld;
    for (std::int64_t j = 0; j < out; ++j) dbias[j] += F::load(row[j]);
  }
}

// A row stride as Gemm takes it: 0 where the rows are dense (one primitive per shape).
std::int64_t stride(std::int64_t ld, std::int64_t width) { return ld == width ? 0 : ld; }

}  // namespace

// y[n, out] (+)= x[n, in] W^T[in, out]
Gemm linear_forward_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate, LinearRows rows) {
  return Gemm{.m = n, .n = out, .k = in, .trans_b = true, .accumulate = accumulate, .lda = stride(rows.in, in),
              .ldc = stride(rows.out, out)};
}

// dx[n, in] (+)= dy[n, out] W[out, in]
Gemm linear_input_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate, LinearRows rows) {
  return Gemm{.m = n, .n = in, .k = out, .accumulate = accumulate, .lda = stride(rows.out, out),
              .ldc = stride(rows.in, in)};
}

// dW[out, in] += dy^T[out, n] x[n, in]
Gemm linear_weight_grad_gemm(std::int64_t n, std::int64_t in, std::int64_t out, LinearRows rows) {
  return Gemm{.m = out, .n = in, .k = n, .trans_a = true, .accumulate = true, .lda = stride(rows.out, out),
              .ldb = stride(rows.in, in)};
}

Gemm typed(Gemm g, DType operands, DType output) {
  g.a_type = g.b_type = operands;
  g.c_type = output;
  return g;
}

template <class FX, class FY>
void linear_forward(const typename FX::T* x, const typename FX::T* weight, const float* bias,
                    typename FY::T* y, std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate,
                    std::uint64_t weights_version, LinearRows rows) {
  cpu::gemm_weights(typed(linear_forward_gemm(n, in, out, accumulate, rows), FX::kDType, FY::kDType), x, weight,
                    weights_version, y, bias);
}

template <class FX, class FD>
void linear_backward(const typename FX::T* dy, const typename FX::T* x, const typename FX::T* weight,
                     typename FD::T* dx, float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx, const float* dy_f32, std::uint64_t weights_version,
                     LinearRows rows) {
  if (dx != nullptr) {
    cpu::gemm_weights(typed(linear_input_grad_gemm(n, in, out, accumulate_dx, rows), FX::kDType, FD::kDType), dy,
                      weight, weights_version, dx);
  }
  cpu::gemm(typed(linear_weight_grad_gemm(n, in, out, rows), FX::kDType, DType::f32), static_cast<const void*>(dy),
            x, dweight);
  if (dbias == nullptr) return;
  const std::int64_t ld = rows.out != 0 ? rows.out : out;
  if (dy_f32 != nullptr) {
    add_rows<cpu::F32Format>(dy_f32, n, out, ld, dbias);
  } else {
    add_rows<FX>(dy, n, out, ld, dbias);
  }
}

// Operands and output of one format, and 16-bit operands with an f32 output.
#define DTRAIN_INSTANTIATE(FX, FY)                                                                       \
  template void linear_forward<FX, FY>(const FX::T*, const FX::T*, const float*, FY::T*, std::int64_t,   \
                                       std::int64_t, std::int64_t, bool, std::uint64_t, LinearRows);     \
  template void linear_backward<FX, FY>(const FX::T*, const FX::T*, const FX::T*, FY::T*, float*, float*, \
                                        std::int64_t, std::int64_t, std::int64_t, bool, const float*,    \
                                        std::uint64_t, LinearRows);
#define DTRAIN_INSTANTIATE_SAME(F) DTRAIN_INSTANTIATE(F, F)
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE_SAME)
DTRAIN_INSTANTIATE(cpu::Bf16Format, cpu::F32Format)
DTRAIN_INSTANTIATE(cpu::F16Format, cpu::F32Format)
#undef DTRAIN_INSTANTIATE_SAME
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn
