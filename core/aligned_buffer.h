// AlignedBuffer: an owned, 64-byte aligned, zero-filled array whose pages are
// touched once at construction (core/pages.h: from 2 MiB up, on huge pages).
// dtrain allocates all hot-path memory this way up front: fresh pages cost
// ~15 us each on first touch, so steady-state steps must only reuse memory
// (docs/ARCHITECTURE.md, "Memory").
#pragma once

#include <cstddef>
#include <span>
#include <utility>

#include "core/pages.h"

namespace dtrain {

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t count) : size_(count) {
    if (count != 0) data_ = static_cast<T*>(allocate_pages(count * sizeof(T)));
  }
  ~AlignedBuffer() { release_pages(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dtrain
