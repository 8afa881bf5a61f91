#include "comm/staging.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace dtrain::comm {

float* Staging::floats(int slot, std::size_t count) {
  DTRAIN_CHECK(slot >= 0 && slot < kSlots, "staging slot {}", slot);
  auto& buffer = buffers_[slot];
  if (buffer.size() < count) buffer.resize(count);  // zero-filled: touched once, here
  return buffer.data();
}

void widen(const void* src, DType dtype, float* dst, std::size_t count) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::bf16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::f16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default:
      DTRAIN_CHECK(false, "cannot widen {}", dtype_name(dtype));
  }
}

void narrow(const float* src, float scale, DType dtype, void* dst, std::size_t count) {
  switch (dtype) {
    case DType::f32: {
      auto* d = static_cast<float*>(dst);
      for (std::size_t i = 0; i < count; ++i) d[i] = src[i] * scale;
      return;
    }
    case DType::bf16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < count; ++i) d[i] = f32_to_bf16(src[i] * scale);
      return;
    }
    case DType::f16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < count; ++i) d[i] = f32_to_f16(src[i] * scale);
      return;
    }
    default:
      DTRAIN_CHECK(false, "cannot narrow to {}", dtype_name(dtype));
  }
}

void scale_f32(float* data, float scale, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) data[i] *= scale;
}

void reduce_into(float* dst, const float* src, std::size_t count, bool max) {
  if (max) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (std::size_t i = 0; i < count; ++i) dst[i] += src[i];
  }
}

}  // namespace dtrain::comm
