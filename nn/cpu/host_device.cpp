#include "nn/cpu/host_device.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/pages.h"
#include "nn/adamw.h"
#include "nn/cpu/convert.h"

namespace dtrain::nn::cpu {

// The queue of a queued HostDevice: items run in order on one thread; item
// k (1-based) is done once completed >= k.
class HostDevice::Queue {
 public:
  // The fence at item `seq`: reached once it ran.
  class Position final : public Fence {
   public:
    Position(std::shared_ptr<const Queue> queue, std::uint64_t seq) : queue_(std::move(queue)), seq_(seq) {}
    bool wait_until(Clock::time_point deadline) const override { return queue_->wait_for(seq_, deadline); }

   private:
    std::shared_ptr<const Queue> queue_;
    std::uint64_t seq_;
  };

  explicit Queue(std::chrono::microseconds delay) : delay_(delay), thread_([this] { loop(); }) {}
  ~Queue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::uint64_t push(std::function<void()> fn) {
    std::uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(std::move(fn));
      seq = ++submitted_;
    }
    cv_.notify_all();
    return seq;
  }

  std::uint64_t submitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }

  // Waits until item `seq` ran; false at the deadline. Rethrows the queue's failure.
  bool wait_for(std::uint64_t seq, Fence::Clock::time_point deadline) const {
    std::unique_lock<std::mutex> lock(mu_);
    const bool reached = done_.wait_until(lock, deadline, [&] { return completed_ >= seq || error_; });
    if (error_) std::rethrow_exception(error_);
    return reached;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
        if (items_.empty()) return;
        fn = std::move(items_.front());
        items_.pop_front();
      }
      std::exception_ptr error;
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        error = error_;
      }
      if (!error) {  // after a failure the rest is skipped: its inputs are not what they should be
        try {
          fn();
        } catch (...) {
          error = std::current_exception();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (error && !error_) error_ = error;
        ++completed_;
      }
      done_.notify_all();
    }
  }

  const std::chrono::microseconds delay_;
  mutable std::mutex mu_;
  std::condition_variable cv_;             // items or stopping
  mutable std::condition_variable done_;   // completed_ or error_ changed
  std::deque<std::function<void()>> items_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is initialised
};

HostDevice::HostDevice(HostDeviceOptions options) : options_(options) {
  if (options_.queued) queue_ = std::make_shared<Queue>(options_.delay);
}

HostDevice::~HostDevice() {
  if (queue_ == nullptr) return;
  try {
    synchronize();  // queued items still use memory their owners are about to free
  } catch (const std::exception&) {  // reported where the work was waited for
  }
}

std::string HostDevice::name() const {
  if (queue_ == nullptr) return "cpu";
  return options_.private_memory ? "cpu (queued, private memory)" : "cpu (queued)";
}

void* HostDevice::allocate(std::size_t bytes) { return allocate_pages(bytes); }  // touched now, not in step 1

void HostDevice::release(void* p) noexcept { release_pages(p); }

void HostDevice::push(std::function<void()> fn) { queue_->push(std::move(fn)); }

void HostDevice::set_profile(KernelProfile* profile) {
  run([profile] { set_thread_profile(profile); });
}

void HostDevice::copy(void* dst, const void* src, std::size_t bytes) {
  run(KernelKind::copy, 2.0 * static_cast<double>(bytes), [=] { std::memcpy(dst, src, bytes); });
}

void HostDevice::zero(void* dst, std::size_t bytes) {
  run(KernelKind::zero, static_cast<double>(bytes), [=] { std::memset(dst, 0, bytes); });
}

FencePtr HostDevice::fence() {
  if (queue_ == nullptr) return nullptr;
  return std::make_shared<Queue::Position>(queue_, queue_->submitted());
}

void HostDevice::wait(const FencePtr& fence) {
  if (fence == nullptr) return;
  const auto timeout = fence_wait_limit(options_.timeout);
  const std::string device = name();
  run(KernelKind::comm_wait, 0.0, [fence, timeout, device] {
    if (!fence->wait_until(Fence::Clock::now() + timeout)) {
      throw TimeoutError(fmt::format("{}: a wait for other work (a collective) did not end within {} ms", device,
                                     timeout.count()));
    }
  });
}

void HostDevice::synchronize() {
  if (queue_ == nullptr) return;
  if (!queue_->wait_for(queue_->submitted(), Fence::Clock::now() + options_.timeout)) {
    throw TimeoutError(fmt::format("{}: queued work did not finish within {} ms", name(), options_.timeout.count()));
  }
}

void HostDevice::to_half(const float* src, std::uint16_t* dst, DType half, std::int64_t n) {
  run(KernelKind::convert, 6.0 * static_cast<double>(n), [=] { f32_to_half(src, half, dst, n); });
}

void HostDevice::to_f32(const std::uint16_t* src, DType half, float* dst, std::int64_t n, bool accumulate) {
  const double bytes = (accumulate ? 10.0 : 6.0) * static_cast<double>(n);  // dst also read when accumulating
  run(KernelKind::convert, bytes,
      [=] { accumulate ? add_half_to_f32(src, half, dst, n) : half_to_f32(src, half, dst, n); });
}

void HostDevice::add(float* dst, const float* src, std::int64_t n) {
  run(KernelKind::add, 12.0 * static_cast<double>(n), [=] {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
  });
}

void HostDevice::sum_of_squares(const float* x, std::int64_t n, double* total) {
  run(KernelKind::sum_of_squares, 4.0 * static_cast<double>(n), [=] { *total += nn::sum_of_squares(x, n); });
}

void HostDevice::adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                       const AdamWHyper& hyper, float weight_decay, std::int64_t step, float grad_scale) {
  // param, exp_avg and exp_avg_sq read and written, grad read: 28 bytes an element.
  run(KernelKind::adamw, 28.0 * static_cast<double>(n),
      [=] { adamw_update(param, grad, exp_avg, exp_avg_sq, n, hyper, weight_decay, step, grad_scale); });
}

}  // namespace dtrain::nn::cpu
