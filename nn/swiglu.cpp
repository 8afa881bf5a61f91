#include "nn/swiglu.h"

#include <algorithm>

#include "nn/cpu/convert.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

namespace {

// Columns per task of backward with a bias gradient: 1 KiB of f32 per row
// of each half, so a task's rows stream through whole cache lines.
constexpr std::int64_t kColumnBlock = 256;

// sigmoid(g) = 1 / (1 + e^-g), with fast_exp (2 ulp): silu(g) = g sigmoid(g)
// within a few ulp of double math for g > -87 (where it is below 1e-36
// anyway). An infinite or NaN g stays non-finite in silu.
inline float sigmoid(float g) { return 1.0f / (1.0f + cpu::fast_exp(-g)); }

// Columns [j0, j1) of one row of backward. With sg = sigmoid(g):
//   silu'(g) = sg (1 + g (1 - sg)), 1 - sg = e^-g sg (no cancellation where sg -> 1).
// sums, when given, is d_bias: its columns j and c + j get the f32 results.
template <class F, bool kSums>
inline void backward_columns(const typename F::T* da, const typename F::T* h, typename F::T* d_h, float* sums,
                             std::int64_t c, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t j = j0; j < j1; ++j) {
    const float g = F::load(h[j]), u = F::load(h[c + j]), d = F::load(da[j]);
    const float e = cpu::fast_exp(-g);
    const float sg = 1.0f / (1.0f + e);
    const float dsilu = sg * (1.0f + g * (e * sg));
    const float d_gate = d * u * dsilu;
    const float d_up = d * (g * sg);
    d_h[j] = F::store(d_gate);
    d_h[c + j] = F::store(d_up);
    if constexpr (kSums) {
      sums[j] += d_gate;
      sums[c + j] += d_up;
    }
  }
}

}  // namespace

// Rows in parallel.
template <class F>
void swiglu_forward(const typename F::T* h, typename F::T* a, std::int64_t n, std::int64_t c, std::int64_t ld_h,
                    std::int64_t ld_a) {
  if (ld_h == 0) ld_h = 2 * c;
  if (ld_a == 0) ld_a = c;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const typename F::T* hi = h + i * ld_h;
    typename F::T* ai = a + i * ld_a;
    for (std::int64_t j = 0; j < c; ++j) {
      const float g = F::load(hi[j]);
      ai[j] = F::store(g * sigmoid(g) * F::load(hi[c + j]));
    }
  }
}

// Without d_bias, rows in parallel. With it, blocks of columns in parallel,
// each over the rows in order: every column of d_bias gets its rows added
// in order on one thread, the same sums whatever the thread count, in the
// same single pass.
template <class F>
void swiglu_backward(const typename F::T* da, const typename F::T* h, typename F::T* d_h, float* d_bias,
                     std::int64_t n, std::int64_t c, std::int64_t ld_a, std::int64_t ld_h) {
  if (ld_h == 0) ld_h = 2 * c;
  if (ld_a == 0) ld_a = c;
  if (d_bias == nullptr) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      backward_columns<F, false>(da + i * ld_a, h + i * ld_h, d_h + i * ld_h, nullptr, c, 0, c);
    }
    return;
  }
  const std::int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t j0 = b * kColumnBlock, j1 = std::min(c, j0 + kColumnBlock);
    for (std::int64_t i = 0; i < n; ++i) {
      backward_columns<F, true>(da + i * ld_a, h + i * ld_h, d_h + i * ld_h, d_bias, c, j0, j1);
    }
  }
}

#define DTRAIN_INSTANTIATE(F)                                                                                 \
  template void swiglu_forward<F>(const F::T*, F::T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t); \
  template void swiglu_backward<F>(const F::T*, const F::T*, F::T*, float*, std::int64_t, std::int64_t,        \
                                   std::int64_t, std::int64_t);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn
