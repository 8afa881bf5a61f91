#include "nn/cpu/convert.h"

namespace dtrain::nn::cpu {
namespace {

template <class Format>
void narrow(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = Format::store(src[i]);
}

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
  with_half_format(dtype, [&](auto f) { narrow<decltype(f)>(src, dst, n); });
}

void half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n) {
  with_half_format(dtype, [&](auto f) { widen<decltype(f)>(src, dst, n); });
}

void add_half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n) {
  with_half_format(dtype, [&](auto f) { widen_add<decltype(f)>(src, dst, n); });
}

}  // namespace dtrain::nn::cpu
