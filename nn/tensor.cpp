#include "nn/tensor.h"

namespace dtrain::nn {

Tensor::Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  DTRAIN_CHECK(rank_ <= kMaxRank, "rank {} exceeds {}", rank_, kMaxRank);
  int i = 0;
  for (std::int64_t d : shape) {
    DTRAIN_CHECK(d >= 0, "negative dimension {}", d);
    shape_[static_cast<std::size_t>(i++)] = d;
  }
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= shape_[static_cast<std::size_t>(i)];
  return n;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

}  // namespace dtrain::nn
