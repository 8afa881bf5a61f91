#include "nn/gelu.h"

#include <cmath>
#include <type_traits>

#include "nn/cpu/isa.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kTanhCubic = 0.044715f;
constexpr std::int64_t kChunk = 4096;
constexpr std::int64_t kBlock = 256;  // a 16-bit format's f32 results, in L1

// GELU of m elements of x (format F) into f32: y, and dydx when not null
// (dydx may be x itself, for f32: each x[i] is read before dydx[i] is written).
template <class F>
__attribute__((always_inline)) inline void gelu_erf_loop(const typename F::T* x, float* y, float* dydx,
                                                         std::int64_t m) {
  if (dydx == nullptr) {
    for (std::int64_t i = 0; i < m; ++i) {
      const float v = F::load(x[i]);
      y[i] = 0.5f * v * (1.0f + cpu::fast_erf(v * kInvSqrt2));
    }
    return;
  }
  for (std::int64_t i = 0; i < m; ++i) {
    const float v = F::load(x[i]);
    const float cdf = 0.5f * (1.0f + cpu::fast_erf(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * cpu::fast_exp(-0.5f * v * v);
    y[i] = v * cdf;
    dydx[i] = cdf + v * pdf;
  }
}

// The tanh form through 0.5 (1 + tanh(u)) = sigmoid(2u) =: s, and
// 1 - tanh(u)^2 = 4 s (1 - s):
//   y = x s,  dydx = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// s and 1 - s are r = 1 / (1 + e) and e r with e = exp(-2|u|) <= 1, one of
// them each by the sign of u (that of x): both keep their relative accuracy
// where they are small, where 1 - tanh would cancel. Far out e is exactly 0,
// so y is x, or 0 below, and dydx 1 or 0, exactly; an infinite x gives an
// infinite y or NaN (-inf times 0), as the erf form does.
template <class F>
__attribute__((always_inline)) inline void gelu_tanh_loop(const typename F::T* x, float* y, float* dydx,
                                                          std::int64_t m) {
  for (std::int64_t i = 0; i < m; ++i) {
    const float v = F::load(x[i]);
    const float u = kSqrt2OverPi * (v + kTanhCubic * v * v * v);
    const float e = cpu::fast_exp(-2.0f * std::fabs(u));
    const float r = 1.0f / (1.0f + e);
    const float s = v >= 0.0f ? r : e * r;
    y[i] = v * s;
    if (dydx != nullptr) {
      const float one_minus_s = v >= 0.0f ? e * r : r;
      dydx[i] = s + 2.0f * v * s * one_minus_s * kSqrt2OverPi * (1.0f + 3.0f * kTanhCubic * v * v);
    }
  }
}

template <class F, GeluForm kForm>
__attribute__((always_inline)) inline void gelu_loop(const typename F::T* x, float* y, float* dydx, std::int64_t m) {
  if constexpr (kForm == GeluForm::erf) {
    gelu_erf_loop<F>(x, y, dydx, m);
  } else if (dydx == nullptr) {
    gelu_tanh_loop<F>(x, y, nullptr, m);  // the branch on dydx folds away in each copy
  } else {
    gelu_tanh_loop<F>(x, y, dydx, m);
  }
}

// The same loop in 512-bit vectors, compiled for AVX-512 whatever the build's
// baseline: GELU's forward is bound by its arithmetic, and ran 1.3x faster
// in cache in 512-bit vectors than in 256 on a Xeon with AVX-512 (where GCC
// prefers 256 by itself). The same bits: each element's operations are the
// same, only more of them run at once.
template <class F, GeluForm kForm>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512"))) void gelu_f32_avx512(
    const typename F::T* x, float* y, float* dydx, std::int64_t m) {
  gelu_loop<F, kForm>(x, y, dydx, m);
}

template <class F, GeluForm kForm>
void gelu_f32(const typename F::T* x, float* y, float* dydx, std::int64_t m) {
  if (cpu::cpu_isa().avx512) {
    gelu_f32_avx512<F, kForm>(x, y, dydx, m);
  } else {
    gelu_loop<F, kForm>(x, y, dydx, m);
  }
}

// f32 writes its results straight into y and dydx; a 16-bit format computes
// a block of them in f32, then rounds it with store_all (0.83-0.86 ns per
// element in bf16, 0.91 rounding each result as it was made).
template <class F, GeluForm kForm>
void gelu_forward_form(const typename F::T* x, typename F::T* y, typename F::T* dydx, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const std::int64_t end = c + kChunk < n ? c + kChunk : n;
    if constexpr (std::is_same_v<typename F::T, float>) {
      gelu_f32<F, kForm>(x + c, y + c, dydx != nullptr ? dydx + c : nullptr, end - c);
    } else {
      alignas(64) float y32[kBlock], dydx32[kBlock];
      for (std::int64_t i = c; i < end; i += kBlock) {
        const std::int64_t m = end - i < kBlock ? end - i : kBlock;
        gelu_f32<F, kForm>(x + i, y32, dydx != nullptr ? dydx32 : nullptr, m);
        cpu::store_all<F>(y32, y + i, m);
        if (dydx != nullptr) cpu::store_all<F>(dydx32, dydx + i, m);  // may overwrite x[i..], already read
      }
    }
  }
}

}  // namespace

// The form is chosen once per call: each has its own loops.
template <class F>
void gelu_forward(const typename F::T* x, typename F::T* y, typename F::T* dydx, std::int64_t n, GeluForm form) {
  if (form == GeluForm::tanh) {
    gelu_forward_form<F, GeluForm::tanh>(x, y, dydx, n);
  } else {
    gelu_forward_form<F, GeluForm::erf>(x, y, dydx, n);
  }
}

// Rows in order, each column's sum added to dbias as it goes (the order of
// linear_backward's own bias sum, so f32 gives the same bits).
template <class F>
void gelu_backward(const typename F::T* dy, const typename F::T* dydx, typename F::T* dx, float* dbias,
                   std::int64_t n, std::int64_t c, std::int64_t ld) {
  if (ld == 0) ld = c;
  if (dbias == nullptr && ld == c) {
    for (std::int64_t i = 0; i < n * c; ++i) dx[i] = F::store(F::load(dy[i]) * F::load(dydx[i]));
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t row = i * ld;
    if (dbias == nullptr) {
      for (std::int64_t j = 0; j < c; ++j) dx[row + j] = F::store(F::load(dy[row + j]) * F::load(dydx[row + j]));
      continue;
    }
    for (std::int64_t j = 0; j < c; ++j) {
      const float v = F::load(dy[row + j]) * F::load(dydx[row + j]);
      dx[row + j] = F::store(v);
      dbias[j] += v;
    }
  }
}

#define DTRAIN_INSTANTIATE(F)                                                           \
  template void gelu_forward<F>(const F::T*, F::T*, F::T*, std::int64_t, GeluForm);    \
  template void gelu_backward<F>(const F::T*, const F::T*, F::T*, float*, std::int64_t, std::int64_t, \
                                  std::int64_t);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn
