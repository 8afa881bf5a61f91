#include "comm/memory_store.h"

#include <chrono>

namespace dtrain::comm {

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mu_);
    table_.set(key, value);
  }
  changed_.notify_all();
}

Bytes MemoryStore::get(const std::string& key, Duration timeout) {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + clamp_store_wait(timeout);
  if (!changed_.wait_until(lock, deadline, [&] { return table_.find(key) != nullptr; })) {
    throw TimeoutError(fmt::format(
        "memory store: get of key '{}' timed out after {} ms; the key was never set "
        "(is the thread that sets it running?)",
        key, timeout.count()));
  }
  return *table_.find(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t result = 0;
  {
    std::lock_guard lock(mu_);
    result = table_.add(key, delta);
  }
  changed_.notify_all();
  return result;
}

Bytes MemoryStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  Bytes after;
  bool stored = false;
  {
    std::lock_guard lock(mu_);
    stored = table_.compare_set(key, expected, desired, after);
  }
  if (stored) changed_.notify_all();
  return after;
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard lock(mu_);
  return table_.erase(key);
}

void MemoryStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + clamp_store_wait(timeout);
  if (!changed_.wait_until(lock, deadline, [&] { return table_.missing(keys).empty(); })) {
    throw TimeoutError(fmt::format(
        "memory store: wait timed out after {} ms; still missing {} "
        "(is the thread that sets them running?)",
        timeout.count(), quote_keys(table_.missing(keys))));
  }
}

bool MemoryStore::check(const std::string& key) {
  std::lock_guard lock(mu_);
  return table_.find(key) != nullptr;
}

std::int64_t MemoryStore::num_keys() {
  std::lock_guard lock(mu_);
  return table_.size();
}

}  // namespace dtrain::comm
