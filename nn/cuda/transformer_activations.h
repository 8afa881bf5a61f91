// Private to nn/cuda/transformer*.cpp: the device activations, backward
// scratch and inputs of nn::cuda::Transformer: the CPU model's buffers
// (nn/transformer_buffers.h) in device memory, sized once, plus what only
// the GPU needs.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "nn/cuda/cross_entropy.h"
#include "nn/cuda/device_buffer.h"
#include "nn/cuda/transformer.h"
#include "nn/transformer_buffers.h"

namespace dtrain::nn::cuda {

using F32 = DeviceBuffer<float>;
using Half = DeviceBuffer<std::uint16_t>;

struct Transformer::Activations : nn::ActivationBuffers<DeviceBuffer> {
  F32 d_bias;  // mixed precision: a 16-bit bias gradient widened before its column sums

  Activations(const ModelConfig& c, std::int64_t B, std::int64_t T)
      : ActivationBuffers(c, B, T),
        d_bias(c.compute == DType::f32 ? 0
                                       : static_cast<std::size_t>(B * T) *
                                             std::max<std::size_t>(3 * static_cast<std::size_t>(c.d_model),
                                                                   static_cast<std::size_t>(c.d_ff))) {}
  std::int64_t bytes() const { return ActivationBuffers::bytes() + static_cast<std::int64_t>(d_bias.bytes()); }
};

struct Transformer::HalfActivations : nn::HalfActivationBuffers<DeviceBuffer> {
  using HalfActivationBuffers::HalfActivationBuffers;
};

// Pinned host memory of `n` elements (cudaHostAlloc), so that copies from it
// are truly asynchronous.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t n) : size_(n) {
    if (n > 0) DTRAIN_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&data_), n * sizeof(T), cudaHostAllocDefault));
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);  // no throw from a destructor
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  T* data() { return data_; }
  std::size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// One micro-batch's inputs on the device, the two pinned slots they are
// staged through (slot i is refilled once the copy recorded by copied[i] is
// done), and the device-side loss accumulator with its pinned read-back.
struct Transformer::Inputs {
  struct Slot {
    PinnedBuffer<std::int32_t> tokens, targets;
    PinnedBuffer<float> patches;
    cudaEvent_t copied = nullptr;
  };
  Slot slots[2];
  int next = 0;
  DeviceBuffer<std::int32_t> tokens, targets;
  F32 patches;
  DeviceBuffer<CrossEntropyDeviceResult> result;
  DeviceBuffer<std::int32_t> bad_index;
  PinnedBuffer<CrossEntropyDeviceResult> host_result;
  PinnedBuffer<std::int32_t> host_bad_index;

  Inputs(std::size_t n_tokens, std::size_t n_patches, std::size_t n_targets)
      : tokens(n_tokens), targets(n_targets), patches(n_patches), result(1), bad_index(1),
        host_result(1), host_bad_index(1) {
    for (Slot& s : slots) {
      s.tokens = PinnedBuffer<std::int32_t>(n_tokens);
      s.targets = PinnedBuffer<std::int32_t>(n_targets);
      s.patches = PinnedBuffer<float>(n_patches);
      DTRAIN_CUDA_TRY(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    }
  }
  ~Inputs() {
    for (Slot& s : slots) {
      if (s.copied != nullptr) cudaEventDestroy(s.copied);
    }
  }
  Inputs(const Inputs&) = delete;
  Inputs& operator=(const Inputs&) = delete;

  std::int64_t bytes() const {
    return static_cast<std::int64_t>(tokens.bytes() + targets.bytes() + patches.bytes() + result.bytes() +
                                     bad_index.bytes());
  }
};

}  // namespace dtrain::nn::cuda
