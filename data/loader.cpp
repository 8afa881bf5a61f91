#include "data/loader.h"

#include "core/error.h"

namespace dtrain::data {
namespace {

int64_t checked_size(const std::shared_ptr<const Dataset>& dataset) {
  DTRAIN_CHECK(dataset != nullptr, "a loader needs a dataset");
  return dataset->size();
}

}  // namespace

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)),
      options_(std::move(options)),
      sampler_(checked_size(dataset_), options_.seed, options_.shuffle),
      start_(options_.start) {
  DTRAIN_CHECK(options_.world > 0 && options_.rank >= 0 && options_.rank < options_.world,
               "loader '{}': rank {} of world {}", options_.name, options_.rank, options_.world);
  DTRAIN_CHECK(options_.start >= 0, "loader '{}': negative start {}", options_.name,
               options_.start);
  if (options_.micro_batch <= 0) {
    throw ConfigError(
        "train.micro_batch_size",
        fmt::format("must be positive, got {} (loader '{}')", options_.micro_batch, options_.name));
  }
  if (options_.prefetch < 0) {
    throw ConfigError("data.prefetch", fmt::format("must be >= 0, got {}", options_.prefetch));
  }
  slots_.reserve(static_cast<std::size_t>(options_.prefetch) + 1);
  for (int i = 0; i <= options_.prefetch; ++i) {
    slots_.push_back(make_batch(dataset_->info(), options_.micro_batch));
  }
  if (options_.prefetch > 0) producer_ = std::thread([this] { produce(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
}

void Loader::fill(int64_t start, int64_t batch_index, Batch& batch) {
  const int B = options_.micro_batch;
  batch.first_sample =
      global_sample(start, batch_index, options_.rank, 0, options_.world, options_.micro_batch);
  for (int row = 0; row < B; ++row) {
    dataset_->fill(sampler_.item(batch.first_sample + row), batch, row);
  }
}

void Loader::produce() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (!error_ && produced_ < consumed_ + options_.prefetch); });
    if (stop_) return;
    const int64_t index = produced_;
    const int64_t start = start_;
    const uint64_t generation = generation_;
    // The slot of batch `index` is free: the caller holds batch consumed_ - 1,
    // and index - (consumed_ - 1) <= prefetch < slots_.size().
    Batch& slot = slots_[static_cast<std::size_t>(index) % slots_.size()];
    lock.unlock();
    std::exception_ptr error;
    try {
      fill(start, index, slot);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // reset() while filling: drop it
    if (error) {
      error_ = error;
    } else {
      ++produced_;
    }
    cv_.notify_all();
  }
}

const Batch& Loader::next(std::chrono::milliseconds timeout) {
  if (options_.prefetch == 0) {
    Batch& slot = slots_[0];
    fill(start_, consumed_, slot);
    ++consumed_;
    return slot;
  }
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(lock, timeout, [&] { return produced_ > consumed_ || error_; });
  if (!ready) {
    throw TimeoutError(fmt::format(
        "data loader '{}' (rank {}): no batch within {} ms (global sample {}); the dataset "
        "is too slow to fill or the producer is stuck; raise data.prefetch or the timeout",
        options_.name, options_.rank, timeout.count(),
        global_sample(start_, consumed_, options_.rank, 0, options_.world, options_.micro_batch)));
  }
  if (produced_ == consumed_) std::rethrow_exception(error_);
  Batch& slot = slots_[static_cast<std::size_t>(consumed_) % slots_.size()];
  ++consumed_;
  lock.unlock();
  cv_.notify_all();
  return slot;
}

int64_t Loader::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return start_ + consumed_ * options_.world * options_.micro_batch;
}

void Loader::reset(int64_t position) {
  DTRAIN_CHECK(position >= 0, "loader '{}': negative position {}", options_.name, position);
  {
    std::lock_guard<std::mutex> lock(mu_);
    start_ = position;
    produced_ = 0;
    consumed_ = 0;
    ++generation_;
    error_ = nullptr;
  }
  cv_.notify_all();
}

}  // namespace dtrain::data
