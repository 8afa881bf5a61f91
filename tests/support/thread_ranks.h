// N ranks as threads over one in-memory store: each thread connects its own
// gloo communicator and runs the test body. Exceptions from any rank are
// collected and the first is rethrown in the calling thread.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/connect.h"
#include "comm/memory_store.h"

namespace dtrain::testing {

inline void run_gloo_ranks(int world, comm::Duration timeout,
                           const std::function<void(comm::Communicator&)>& body) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::CommunicatorOptions options;
        options.timeout = timeout;
        options.store = store;
        comm::Communicator comm(comm::make_gloo_backend(r, world, store, timeout, "127.0.0.1"), options);
        body(comm);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace dtrain::testing
