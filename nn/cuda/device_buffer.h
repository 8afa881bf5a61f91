// DeviceBuffer<T>: n elements of device memory owned by one object (cudaMalloc
// on construction, cudaFree on destruction), movable, not copyable.
// Copies are stream-ordered (cudaMemcpyAsync); the host memory of an async
// copy must stay alive until the stream reaches it. The *_sync helpers wait
// for the copy and are meant for tests and set-up, not for a training step.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "nn/cuda/check.h"

namespace dtrain::nn::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : size_(n) {
    if (n > 0) DTRAIN_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);  // no throw from a destructor
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }

  // REQUIRES: src holds size() elements, alive until the stream runs the copy.
  void upload(const T* src, cudaStream_t stream) {
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(data_, src, bytes(), cudaMemcpyHostToDevice, stream));
  }
  void download(T* dst, cudaStream_t stream) const {
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(dst, data_, bytes(), cudaMemcpyDeviceToHost, stream));
  }
  void zero(cudaStream_t stream) { DTRAIN_CUDA_TRY(cudaMemsetAsync(data_, 0, bytes(), stream)); }

  static DeviceBuffer from_host_sync(const std::vector<T>& host) {
    DeviceBuffer b(host.size());
    DTRAIN_CUDA_TRY(cudaMemcpy(b.data_, host.data(), b.bytes(), cudaMemcpyHostToDevice));
    return b;
  }
  std::vector<T> to_host_sync() const {
    std::vector<T> host(size_);
    DTRAIN_CUDA_TRY(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dtrain::nn::cuda
