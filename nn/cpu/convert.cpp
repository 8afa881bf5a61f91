#include "nn/cpu/convert.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "nn/cpu/isa.h"

namespace dtrain::nn::cpu {
namespace {

// The first n / 16 * 16 floats of src rounded into bf16 by the CPU's own
// instruction (round to nearest even, as Bf16Format::store), blocks holding a
// zero or subnormal by Format::store (the instruction flushes subnormals).
// Compiled for AVX512_BF16 whatever the build's baseline; called only where
// cpu_isa().avx512_bf16.
template <class Format>
__attribute__((target("avx512f,avx512bf16"))) std::int64_t store_bf16_avx512(const float* src,
                                                                             typename Format::T* dst,
                                                                             std::int64_t n) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    if (_mm512_testn_epi32_mask(_mm512_castps_si512(v), exponent) != 0) {  // a zero or subnormal
      for (std::int64_t j = i; j < i + 16; ++j) dst[j] = Format::store(src[j]);
      continue;
    }
    const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), rounded);
  }
  return i;
}

}  // namespace

template <class Format>
void store_all(const float* src, typename Format::T* dst, std::int64_t n) {
  std::int64_t i = 0;
  if constexpr (Format::kDType == DType::bf16) {
    if (cpu_isa().avx512_bf16) i = store_bf16_avx512<Format>(src, dst, n);
  }
  for (; i < n; ++i) dst[i] = Format::store(src[i]);
}

#define DTRAIN_INSTANTIATE(F) template void store_all<F>(const float*, F::T*, std::int64_t);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

namespace {

template <class Format>
void widen(const std::uint16_t* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = Format::load(src[i]);
}

template <class Format>
void widen_add(const std::uint16_t* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += Format::load(src[i]);
}

}  // namespace

void f32_to_half(const float* src, DType dtype, std::uint16_t* dst, std::int64_t n) {
  with_half_format(dtype, [&](auto f) { store_all<decltype(f)>(src, dst, n); });
}

void half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n) {
  with_half_format(dtype, [&](auto f) { widen<decltype(f)>(src, dst, n); });
}

void add_half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n) {
  with_half_format(dtype, [&](auto f) { widen_add<decltype(f)>(src, dst, n); });
}

}  // namespace dtrain::nn::cpu
