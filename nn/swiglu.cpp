#include "nn/swiglu.h"

#include <algorithm>

#include "nn/cpu/convert.h"
#include "nn/cpu/isa.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

namespace {

// Columns per task of backward with a bias gradient: 1 KiB of f32 per row
// of each half, so a task's rows stream through whole cache lines.
constexpr std::int64_t kColumnBlock = 256;
// Columns of backward's f32 results held at once (two blocks, 2 KiB in L1).
constexpr std::int64_t kBlock = 256;

// sigmoid(g) = 1 / (1 + e^-g), with fast_exp (2 ulp): silu(g) = g sigmoid(g)
// within a few ulp of double math for g > -87 (where it is below 1e-36
// anyway). An infinite or NaN g stays non-finite in silu.
__attribute__((always_inline)) inline float sigmoid(float g) { return 1.0f / (1.0f + cpu::fast_exp(-g)); }

// a = silu(gate) * up for m columns.
template <class F>
__attribute__((always_inline)) inline void forward_loop(const typename F::T* gate, const typename F::T* up,
                                                        typename F::T* a, std::int64_t m) {
  for (std::int64_t j = 0; j < m; ++j) {
    const float g = F::load(gate[j]);
    a[j] = F::store(g * sigmoid(g) * F::load(up[j]));
  }
}

// Backward's f32 results for m columns. With sg = sigmoid(g):
//   silu'(g) = sg (1 + g (1 - sg)), 1 - sg = e^-g sg (no cancellation where sg -> 1).
template <class F>
__attribute__((always_inline)) inline void backward_loop(const typename F::T* da, const typename F::T* gate,
                                                         const typename F::T* up, float* d_gate, float* d_up,
                                                         std::int64_t m) {
  for (std::int64_t k = 0; k < m; ++k) {
    const float g = F::load(gate[k]), u = F::load(up[k]), d = F::load(da[k]);
    const float e = cpu::fast_exp(-g);
    const float sg = 1.0f / (1.0f + e);
    d_gate[k] = d * u * (sg * (1.0f + g * (e * sg)));
    d_up[k] = d * (g * sg);
  }
}

// The same loops in 512-bit vectors where the CPU has AVX-512, as GELU's
// (gelu.cpp): bound by exp and the division, not by memory. The same bits:
// each element's operations are the same.
#define DTRAIN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
template <class F>
DTRAIN_AVX512 void forward_avx512(const typename F::T* gate, const typename F::T* up, typename F::T* a,
                                  std::int64_t m) {
  forward_loop<F>(gate, up, a, m);
}
template <class F>
DTRAIN_AVX512 void backward_avx512(const typename F::T* da, const typename F::T* gate, const typename F::T* up,
                                   float* d_gate, float* d_up, std::int64_t m) {
  backward_loop<F>(da, gate, up, d_gate, d_up, m);
}
#undef DTRAIN_AVX512

// Columns [j0, j1) of one row of backward. The f32 results go through two
// blocks on the stack, then are rounded into d_h and, when sums (d_bias) is
// given, added to its columns j and c + j: each loop then has one stream to
// write, and all of them vectorise.
template <class F, bool kSums>
void backward_columns(const typename F::T* da, const typename F::T* h, typename F::T* d_h, float* sums,
                      std::int64_t c, std::int64_t j0, std::int64_t j1, bool avx512) {
  alignas(64) float d_gate[kBlock], d_up[kBlock];
  for (std::int64_t jb = j0; jb < j1; jb += kBlock) {
    const std::int64_t m = std::min(kBlock, j1 - jb);
    if (avx512) {
      backward_avx512<F>(da + jb, h + jb, h + c + jb, d_gate, d_up, m);
    } else {
      backward_loop<F>(da + jb, h + jb, h + c + jb, d_gate, d_up, m);
    }
    cpu::store_all<F>(d_gate, d_h + jb, m);
    cpu::store_all<F>(d_up, d_h + c + jb, m);
    if constexpr (kSums) {
      for (std::int64_t k = 0; k < m; ++k) sums[jb + k] += d_gate[k];
      for (std::int64_t k = 0; k < m; ++k) sums[c + jb + k] += d_up[k];
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
  const bool avx512 = cpu::cpu_isa().avx512;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const typename F::T* hi = h + i * ld_h;
    if (avx512) {
      forward_avx512<F>(hi, hi + c, a + i * ld_a, c);
    } else {
      forward_loop<F>(hi, hi + c, a + i * ld_a, c);
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
  const bool avx512 = cpu::cpu_isa().avx512;
  if (d_bias == nullptr) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      backward_columns<F, false>(da + i * ld_a, h + i * ld_h, d_h + i * ld_h, nullptr, c, 0, c, avx512);
    }
    return;
  }
  const std::int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t j0 = b * kColumnBlock, j1 = std::min(c, j0 + kColumnBlock);
    for (std::int64_t i = 0; i < n; ++i) {
      backward_columns<F, true>(da + i * ld_a, h + i * ld_h, d_h + i * ld_h, d_bias, c, j0, j1, avx512);
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
