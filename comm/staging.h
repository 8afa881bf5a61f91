// Host scratch space that CPU backends reuse across operations: 16-bit
// reductions are widened into f32 here (so sums accumulate in f32), and
// algorithms keep their receive buffers here. Buffers only grow, so steady
// training touches no fresh memory (fresh pages cost ~15 us each).
// Used by one comm thread only.
#pragma once

#include <cstddef>
#include <vector>

#include "core/dtype.h"

namespace dtrain::comm {

class Staging {
 public:
  // A buffer of at least `count` floats; `slot` picks one of kSlots independent buffers.
  float* floats(int slot, std::size_t count);
  static constexpr int kSlots = 3;

 private:
  std::vector<float> buffers_[kSlots];
};

// dst[i] = float(src[i]) for a buffer of `dtype` (f32, bf16 or f16).
void widen(const void* src, DType dtype, float* dst, std::size_t count);
// dst[i] = dtype(src[i] * scale), rounding to nearest even.
void narrow(const float* src, float scale, DType dtype, void* dst, std::size_t count);
// data[i] *= scale, in the buffer's own dtype (f32 only; 16-bit goes through narrow).
void scale_f32(float* data, float scale, std::size_t count);
// Elementwise dst = dst (op) src over floats, op being sum or max.
void reduce_into(float* dst, const float* src, std::size_t count, bool max);

}  // namespace dtrain::comm
