// nn::cpu::HostDevice: the CPU as an nn::Device (nn/device.h). Memory is
// host memory; kernels are oneDNN and dtrain's vector code (nn/*.h).
//
// Plain (the default): every call runs inline on the calling thread, so a
// step costs no queueing at all and fence() is always null.
//
// Queued (tests): every copy, fill and kernel runs on a queue thread of its
// own, in submission order, optionally after a delay each, with fences at
// the queue's positions. It behaves like a GPU stream in every way the
// training loop can observe, so the engine's fences and waits between
// compute and communication are proven on the CPU: a missing one makes a
// collective read what the queue has not written yet, and the results differ.
// A kernel that throws fails the queue: later items are skipped, and the
// error is rethrown by the next synchronize(), wait() or fence wait.
// With private_memory it also says the host cannot reach its memory, as a
// GPU does, so its users stage state through host copies as they must on a
// GPU (the memory is host memory all the same).
//
// Profiling: with set_profile, every kernel, copy and wait is timed into a
// KernelProfile on the thread that runs it (nn/cpu/kernel_profile.h).
//
// Threading: one thread submits; fences may be waited on from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <utility>

#include "nn/cpu/kernel_profile.h"
#include "nn/device.h"

namespace dtrain::nn::cpu {

struct HostDeviceOptions {
  bool queued = false;
  bool private_memory = false;                 // host_memory() is false (tests)
  std::chrono::microseconds delay{0};          // queued: sleep before every item
  std::chrono::milliseconds timeout{300000};   // every wait (parallel.timeout_s)
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(HostDeviceOptions options = {});
  ~HostDevice() override;

  std::string name() const override;
  bool host_memory() const override { return !options_.private_memory; }
  bool asynchronous() const override { return queue_ != nullptr; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  void* allocate(std::size_t bytes) override;
  void release(void* p) noexcept override;
  void* allocate_host(std::size_t bytes) override { return allocate(bytes); }
  void release_host(void* p) noexcept override { release(p); }

  void copy(void* dst, const void* src, std::size_t bytes) override;
  void zero(void* dst, std::size_t bytes) override;
  FencePtr fence() override;
  void wait(const FencePtr& fence) override;
  void synchronize() override;

  void to_half(const float* src, std::uint16_t* dst, DType half, std::int64_t n) override;
  void to_f32(const std::uint16_t* src, DType half, float* dst, std::int64_t n, bool accumulate) override;
  void add(float* dst, const float* src, std::int64_t n) override;
  void sum_of_squares(const float* x, std::int64_t n, double* total) override;
  void adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
             const AdamWHyper& hyper, float weight_decay, std::int64_t step, float grad_scale) override;

  std::unique_ptr<Model> make_model(const ModelConfig& config, const ParameterLayout& layout, std::int64_t batch,
                                    std::int64_t seq_len) override;

  // Times the work submitted from now on into `profile` (null: no more), on
  // the thread that runs it: the caller's (plain) or the queue's (queued),
  // whose profile the caller reads after synchronize(). The profile must
  // outlive the timed work.
  void set_profile(KernelProfile* profile);

  // Runs fn now (plain) or queues it (queued) as one `kind` kernel doing
  // `work` (nn/cpu/kernel_profile.h: FLOPs or bytes). fn must own or outlive
  // what it uses.
  template <class Fn>
  void run(KernelKind kind, double work, Fn&& fn) {
    if (queue_ == nullptr) {
      const KernelTimer timer(kind, work);
      fn();
    } else {
      push(std::function<void()>([kind, work, fn = std::forward<Fn>(fn)]() mutable {
        const KernelTimer timer(kind, work);
        fn();
      }));
    }
  }
  // The same, untimed as a whole: for kernels whose parts time themselves
  // (a linear's GEMMs and bias gradient, attention's steps).
  template <class Fn>
  void run(Fn&& fn) {
    if (queue_ == nullptr) {
      fn();
    } else {
      push(std::function<void()>(std::forward<Fn>(fn)));
    }
  }

 private:
  class Queue;
  void push(std::function<void()> fn);

  HostDeviceOptions options_;
  std::shared_ptr<Queue> queue_;  // queued only; fences share it
};

}  // namespace dtrain::nn::cpu
