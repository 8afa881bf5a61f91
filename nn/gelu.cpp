#include "nn/gelu.h"

#include "nn/cpu/convert.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr std::int64_t kChunk = 4096;
}  // namespace

void gelu_forward(const float* x, float* y, float* dydx, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const std::int64_t end = c + kChunk < n ? c + kChunk : n;
    if (dydx == nullptr) {
      for (std::int64_t i = c; i < end; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + cpu::fast_erf(v * kInvSqrt2));
      }
      continue;
    }
    for (std::int64_t i = c; i < end; ++i) {
      const float v = x[i];
      const float cdf = 0.5f * (1.0f + cpu::fast_erf(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * cpu::fast_exp(-0.5f * v * v);
      y[i] = v * cdf;
      dydx[i] = cdf + v * pdf;  // may overwrite x[i], already read
    }
  }
}

void gelu_backward(const float* dy, const float* dydx, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * dydx[i];
}

namespace {

template <class F>
void gelu_forward_rows(const std::uint16_t* x, std::uint16_t* y, std::uint16_t* dydx,
                       std::int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const std::int64_t end = c + kChunk < n ? c + kChunk : n;
    if (dydx == nullptr) {
      for (std::int64_t i = c; i < end; ++i) {
        const float v = F::load(x[i]);
        y[i] = F::store(0.5f * v * (1.0f + cpu::fast_erf(v * kInvSqrt2)));
      }
      continue;
    }
    for (std::int64_t i = c; i < end; ++i) {
      const float v = F::load(x[i]);
      const float cdf = 0.5f * (1.0f + cpu::fast_erf(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * cpu::fast_exp(-0.5f * v * v);
      y[i] = F::store(v * cdf);
      dydx[i] = F::store(cdf + v * pdf);
    }
  }
}

}  // namespace

void gelu_forward_half(DType dtype, const std::uint16_t* x, std::uint16_t* y,
                       std::uint16_t* dydx, std::int64_t n) {
  cpu::with_half_format(dtype, [&](auto f) { gelu_forward_rows<decltype(f)>(x, y, dydx, n); });
}

void gelu_backward_half(DType dtype, std::uint16_t* dy_dx, const std::uint16_t* dydx,
                        std::int64_t n) {
  cpu::with_half_format(dtype, [&](auto f) {
    using F = decltype(f);
    for (std::int64_t i = 0; i < n; ++i) dy_dx[i] = F::store(F::load(dy_dx[i]) * F::load(dydx[i]));
  });
}

}  // namespace dtrain::nn
