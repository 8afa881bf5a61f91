// Bulk conversions between f32 and the 16-bit float formats (bf16, f16),
// rounding to nearest even (core/dtype.h gives the per-element rules: NaN
// stays NaN, overflow becomes inf, subnormals are kept). Used by the
// mixed-precision layers, the sharding engine's compute copies and its
// 16-bit gradient communication. Loops are written so that GCC vectorises
// them; any thread may call them on disjoint memory.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace dtrain::nn::cpu {

// The storage formats as load/store policies, for kernels templated on them:
// T is the element type in memory, load/store convert to and from f32 (f32
// itself: the identity). Kernels written once over a format serve f32 and
// both 16-bit types.
struct F32Format {
  static constexpr DType kDType = DType::f32;
  using T = float;
  static float load(float f) { return f; }
  static float store(float f) { return f; }
};

struct Bf16Format {
  static constexpr DType kDType = DType::bf16;
  using T = std::uint16_t;
  static float load(std::uint16_t h) { return bf16_to_f32(h); }
  static std::uint16_t store(float f) { return f32_to_bf16(f); }
};

struct F16Format {
  static constexpr DType kDType = DType::f16;
  using T = std::uint16_t;
  static float load(std::uint16_t h) { return f16_to_f32(h); }
  static std::uint16_t store(float f) { return f32_to_f16(f); }
};

// Calls fn(Bf16Format{}) or fn(F16Format{}) for dtype.
// REQUIRES: dtype is bf16 or f16.
template <class Fn>
decltype(auto) with_half_format(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) return fn(Bf16Format{});
  DTRAIN_CHECK(dtype == DType::f16, "{} is not a 16-bit float type", dtype_name(dtype));
  return fn(F16Format{});
}

// Instantiates a template for each storage format: X(F32Format) X(Bf16Format) X(F16Format).
#define DTRAIN_FOR_EACH_FORMAT(X) X(::dtrain::nn::cpu::F32Format) X(::dtrain::nn::cpu::Bf16Format) X(::dtrain::nn::cpu::F16Format)

// dst[i] = Format::store(src[i]), n elements, for any format. bf16 on a CPU
// with AVX512-BF16 (a native build) goes 16 at a time through its conversion
// instruction, which rounds to nearest even and quiets NaN as the rule above
// does, but flushes subnormals to zero: a block of 16 holding a zero or
// subnormal exponent takes the rule itself, so the bits are the same either
// way (0.07 against 0.09 ns per element in bulk; GELU's bf16 forward, which
// rounds two results per element, 0.83-0.86 against 0.91).
template <class Format>
void store_all(const float* src, typename Format::T* dst, std::int64_t n);

// dst[i] = round(src[i]) in `dtype` (bf16 or f16), n elements.
void f32_to_half(const float* src, DType dtype, std::uint16_t* dst, std::int64_t n);
// dst[i] = src[i] widened to f32 (exact).
void half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n);
// dst[i] += src[i] widened to f32.
void add_half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n);

}  // namespace dtrain::nn::cpu
