// Storage formats of the CUDA layers: a layer is written once as a template
// over the format D of its 16-bit-or-f32 operands (DType::f32, bf16 or f16)
// and instantiated for each; Storage<D> is the element type in memory
// (16-bit formats are raw std::uint16_t, as on the CPU). The device side
// (load/store in f32) is device_math.cuh's Format<D>.
// Free of fmt, so .cu files include it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace dtrain::nn::cuda {

template <DType D>
using Storage = std::conditional_t<D == DType::f32, float, std::uint16_t>;

// The format of element type E in a precision whose 16-bit type is `half`:
// float is f32, a 16-bit element is `half`.
template <class E, DType half>
inline constexpr DType kFormatOf = std::is_same_v<std::remove_const_t<E>, float> ? DType::f32 : half;

}  // namespace dtrain::nn::cuda

// Instantiates a layer for every format: X(DType::f32) X(DType::bf16) X(DType::f16).
#define DTRAIN_CUDA_FOR_EACH_FORMAT(X) X(::dtrain::DType::f32) X(::dtrain::DType::bf16) X(::dtrain::DType::f16)
