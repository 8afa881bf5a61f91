// nn::Device: where a model and its training state live and run (the host,
// a host queue for tests, a CUDA GPU). The model graph (nn/graph.h) and the
// data-parallel engine (sharding/engine.h) are written once against this
// interface; only the kernels behind it differ (docs/ARCHITECTURE.md, "One
// graph, one engine, kernels per device").
//
// Ordering: copies, zero fills and kernels (the engine's below, the model's
// through its kernel set) run in submission order on the device's queue (a
// CUDA stream; inline on the plain host device). fence() marks the current
// end of that queue for a collective to wait on; wait(fence) makes later work
// wait for someone else's (a collective's completion). The host sees device
// memory only after synchronize(). Every wait is bounded by timeout().
//
// Memory: allocate once at set-up and reuse (fresh pages cost ~15 us each
// here); DeviceArray below owns an allocation.
//
// Threading: one thread submits work; fences may be waited on from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "core/fence.h"

namespace dtrain::nn {

class Model;
struct ModelConfig;
class ParameterLayout;
struct AdamWHyper;

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;  // "cpu", "cpu (queued)", "cuda:0"
  // Whether the host may read and write device memory directly (after synchronize()).
  virtual bool host_memory() const = 0;
  // Whether queued work may still be running when a call returns (false:
  // everything runs inline and fence() is always null).
  virtual bool asynchronous() const = 0;
  // How long any wait of this device may take before it throws TimeoutError.
  virtual std::chrono::milliseconds timeout() const = 0;

  // Zero-filled device memory; released by release() once no queued work uses it.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  // Host memory that queued copies may read or fill asynchronously (pinned on CUDA).
  virtual void* allocate_host(std::size_t bytes) = 0;
  virtual void release_host(void* p) noexcept = 0;

  // Queued: any of host/device memory to any (host memory must stay valid and
  // untouched until the queue has run the copy).
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void zero(void* dst, std::size_t bytes) = 0;
  // A fence at the current end of the queue; null when nothing queued can
  // still be running (the plain host device runs everything inline).
  virtual FencePtr fence() = 0;
  // Work submitted from now on runs once `fence` is reached (null: at once).
  // A failure behind the fence (a failed collective) is rethrown here or by
  // the next synchronize(). A wait on the host is bounded by
  // fence_wait_limit(timeout()).
  virtual void wait(const FencePtr& fence) = 0;
  // The host waits until everything queued has run; rethrows a failure of queued work.
  virtual void synchronize() = 0;

  // The engine's kernels (queued). 16-bit buffers are std::uint16_t of `half`
  // (bf16 or f16); f32 arithmetic; n elements.
  virtual void to_half(const float* src, std::uint16_t* dst, DType half, std::int64_t n) = 0;
  // dst = src widened (accumulate: dst += src widened).
  virtual void to_f32(const std::uint16_t* src, DType half, float* dst, std::int64_t n, bool accumulate) = 0;
  virtual void add(float* dst, const float* src, std::int64_t n) = 0;  // dst += src
  // *total += sum of x[i]^2 (accumulated in double; total is device memory).
  virtual void sum_of_squares(const float* x, std::int64_t n, double* total) = 0;
  // nn::adamw_update on device memory.
  virtual void adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                     const AdamWHyper& hyper, float weight_decay, std::int64_t step, float grad_scale) = 0;

  // The Transformer of `config` on this device, with activations for
  // micro-batches of `batch` x `seq_len` (nn/transformer.h).
  virtual std::unique_ptr<Model> make_model(const ModelConfig& config, const ParameterLayout& layout,
                                            std::int64_t batch, std::int64_t seq_len) = 0;
};

// How long a device waits on the host for someone else's fence: longer than
// its own timeout, because the fence's producer (a collective) fails by
// itself within its timeout and diagnosis, and that error, which names the
// ranks that did not arrive, is the one to report.
inline std::chrono::milliseconds fence_wait_limit(std::chrono::milliseconds timeout) {
  return 2 * timeout + std::chrono::seconds(10);
}

// n elements of T owned in a device's memory (kHost false: allocate(); true:
// allocate_host()), zero-filled at construction, released at destruction.
// The device must outlive it.
template <class T, bool kHost>
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  DeviceAllocation(Device& device, std::size_t n)
      : data_(n == 0 ? nullptr
                     : static_cast<T*>(kHost ? device.allocate_host(n * sizeof(T)) : device.allocate(n * sizeof(T))),
              Release{&device}),
        size_(n) {}

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return data_ ? size_ : 0; }
  std::size_t bytes() const { return size() * sizeof(T); }

 private:
  struct Release {
    Device* device = nullptr;
    void operator()(T* p) const noexcept {
      if (kHost) {
        device->release_host(p);
      } else {
        device->release(p);
      }
    }
  };
  std::unique_ptr<T, Release> data_;
  std::size_t size_ = 0;
};

template <class T>
using DeviceArray = DeviceAllocation<T, false>;  // device memory
template <class T>
using HostArray = DeviceAllocation<T, true>;     // host memory for asynchronous copies

}  // namespace dtrain::nn
