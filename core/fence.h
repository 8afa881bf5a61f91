// Fence: a point in someone's asynchronous work that another party waits
// for. A device (nn/device.h) hands out fences at the end of its queue so a
// collective starts only after the kernels that produce its input; a
// collective (comm::Work::done_fence) hands out one a device's queue waits on
// before the kernels that read its output. Either side may be a host queue
// (the waiter blocks a thread) or a CUDA stream (the waiter's stream waits
// for cuda_event() on the GPU and no host thread blocks).
//
// Threading: any thread may wait on a fence; a fence stays valid (and its
// event recorded) for as long as someone holds it.
#pragma once

#include <chrono>
#include <memory>

namespace dtrain {

class Fence {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Fence() = default;

  // Blocks the calling thread until the point is reached; false if
  // `deadline` passed first. Rethrows the producer's failure (a collective
  // that failed, a kernel that threw) when it has one.
  virtual bool wait_until(Clock::time_point deadline) const = 0;
  // A cudaEvent_t that completes at this point, when the producer is a CUDA
  // stream; null otherwise. A CUDA consumer waits on it without the host.
  virtual const void* cuda_event() const { return nullptr; }
};

using FencePtr = std::shared_ptr<const Fence>;

}  // namespace dtrain
