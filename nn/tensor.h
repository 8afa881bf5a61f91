// nn::Tensor: a non-owning view (pointer, dtype, device, shape) of contiguous
// row-major memory. Whoever creates a Tensor keeps its storage alive; layers
// and kernels only read and write through views. Parameters in particular are
// views into flat buffers owned outside the model (docs/ARCHITECTURE.md, "Core abstractions").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace dtrain::nn {

using dtrain::DType;
using dtrain::dtype_name;
using dtrain::dtype_size;
enum class Device : std::uint8_t { cpu, cuda };

class Tensor {
 public:
  static constexpr int kMaxRank = 4;

  Tensor() = default;
  Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
         Device device = Device::cpu);
  static Tensor f32(float* data, std::initializer_list<std::int64_t> shape) {
    return Tensor(data, DType::f32, shape);
  }

  void* data() const { return data_; }
  float* f32() const {
    DTRAIN_CHECK(dtype_ == DType::f32, "tensor is {}, not f32", dtype_name(dtype_));
    return static_cast<float*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int rank() const { return rank_; }
  std::int64_t dim(int i) const { return shape_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  std::string shape_string() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
  int rank_ = 0;
  std::array<std::int64_t, kMaxRank> shape_{};
};

}  // namespace dtrain::nn
