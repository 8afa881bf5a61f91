#include "core/cuda/event_fence.h"

#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/check.h"

namespace dtrain::cuda {

// The events not held by a fence.
class EventPool::Events {
 public:
  explicit Events(int device) : device_(device) {}
  ~Events() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);  // no throw from a destructor
  }

  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    DTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  void give_back(cudaEvent_t e) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      free_.push_back(e);
    } catch (...) {
      cudaEventDestroy(e);  // out of memory for the list: the event is not worth keeping
    }
  }

  int device() const { return device_; }

 private:
  const int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

namespace {

class EventFence final : public Fence {
 public:
  EventFence(std::shared_ptr<EventPool::Events> events, cudaEvent_t event)
      : events_(std::move(events)), event_(event) {}
  ~EventFence() override { events_->give_back(event_); }
  EventFence(const EventFence&) = delete;
  EventFence& operator=(const EventFence&) = delete;

  bool wait_until(Clock::time_point deadline) const override {
    return poll_until([e = event_] { return cudaEventQuery(e); }, "cudaEventQuery", events_->device(), deadline);
  }
  const void* cuda_event() const override { return event_; }

 private:
  std::shared_ptr<EventPool::Events> events_;
  cudaEvent_t event_;
};

}  // namespace

EventPool::EventPool(int device) : device_(device), events_(std::make_shared<Events>(device)) {}

FencePtr EventPool::record(cudaStream_t stream) {
  cudaEvent_t e = events_->take();
  const cudaError_t recorded = cudaEventRecord(e, stream);
  if (failed(recorded)) {
    events_->give_back(e);
    throw_failure(recorded, "cudaEventRecord(event, stream)", __FILE__, __LINE__, device_);
  }
  return std::make_shared<EventFence>(events_, e);
}

bool poll_until(const std::function<cudaError_t()>& query, const char* call, int device,
                Fence::Clock::time_point deadline) {
  constexpr int kYields = 1000;  // about the length of a short kernel; then sleep between polls
  for (int polls = 0;; ++polls) {
    const cudaError_t e = query();
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) throw_failure(e, call, __FILE__, __LINE__, device);
    if (Fence::Clock::now() >= deadline) return false;
    if (polls < kYields) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace dtrain::cuda
