// Element types shared by tensors (nn/) and collectives (comm/), and the
// 16-bit float conversions both need. bf16 and f16 are stored as raw
// uint16_t; conversions round to nearest even, as PyTorch and NCCL do.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dtrain {

enum class DType : std::uint8_t { f32, bf16, f16, i32, u16 };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

inline float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float f16_to_f32(std::uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
inline std::uint16_t f32_to_f16(float f) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
}

}  // namespace dtrain
