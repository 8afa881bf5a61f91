// Loader: this rank's micro-batches of a Dataset, in the order of sampler.h,
// filled ahead by one background thread into a ring of preallocated slots.
//
// Threads: one consumer thread calls next(), position() and reset(); the
// producer thread is private. The loader co-owns its dataset.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"

namespace dtrain::data {

struct LoaderOptions {
  std::string name = "train";  // for messages
  int micro_batch = 1;         // B: rows per batch on this rank
  int rank = 0;
  int world = 1;
  uint64_t seed = 0;  // shuffle seed
  bool shuffle = false;
  int prefetch = 2;   // batches filled ahead; 0 fills synchronously in next()
  int64_t start = 0;  // global sample index of the first batch (a checkpoint's position)
};

class Loader {
 public:
  // Allocates prefetch + 1 batch slots (the batches filled ahead plus the one
  // the caller holds) and starts the producer when prefetch > 0.
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();  // stops and joins the producer
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // This rank's next micro-batch, valid until the next call to next() or
  // reset(). Throws TimeoutError naming the loader when no batch is ready
  // within `timeout`, and rethrows an exception of the producer (the same one
  // on every later call, until reset()).
  const Batch& next(std::chrono::milliseconds timeout);

  // Global sample index after the batches handed out so far: store it in a
  // checkpoint and pass it as LoaderOptions::start to resume, on any world size.
  int64_t position() const;

  // Restarts at global sample `position`, dropping batches filled ahead and a
  // stored producer error; no allocation and no new thread, so evaluation can
  // rewind a validation loader to 0 before each pass.
  void reset(int64_t position);

  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }

 private:
  void produce();
  void fill(int64_t start, int64_t batch_index, Batch& batch);

  const std::shared_ptr<const Dataset> dataset_;
  const LoaderOptions options_;
  Sampler sampler_;  // used by whichever thread fills (producer, or next() when prefetch = 0)
  std::vector<Batch> slots_;  // batch k lives in slots_[k % slots_.size()]

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t start_;            // guarded by mu_, as are the fields below
  int64_t produced_ = 0;     // batches filled since start_
  int64_t consumed_ = 0;     // batches handed out since start_
  uint64_t generation_ = 0;  // bumped by reset(); a fill begun before it is dropped
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread producer_;
};

}  // namespace dtrain::data
