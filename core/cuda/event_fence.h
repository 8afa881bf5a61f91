// Fences (core/fence.h) on CUDA streams: EventPool::record() marks the
// current end of a stream with a CUDA event and hands it out as a Fence, so
// another stream waits for it on the GPU (cuda_event()) and a host thread
// polls it against its deadline (wait_until). Events are reused: one goes
// back to its pool when the last holder of its fence drops it, and is never
// recorded again while a fence holds it.
//
// Threading: record() on a thread whose current device is the pool's (the
// one that queues on the stream); fences may be waited on and dropped on any
// thread. The events live until the pool and all its fences are gone.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "core/fence.h"

namespace dtrain::cuda {

class EventPool {
 public:
  explicit EventPool(int device);
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A fence at the current end of `stream` (of the pool's device).
  FencePtr record(cudaStream_t stream);

  class Events;  // the free events (event_fence.cpp)

 private:
  int device_;
  std::shared_ptr<Events> events_;  // shared with every fence out
};

// Polls `query` (a cudaEventQuery or cudaStreamQuery) until it reports
// success (true) or `deadline` passes (false); throws naming `call` and the
// device on any error but cudaErrorNotReady. Yields first, then sleeps a
// little between polls, so a long wait does not hold a core.
bool poll_until(const std::function<cudaError_t()>& query, const char* call, int device,
                Fence::Clock::time_point deadline);

}  // namespace dtrain::cuda
