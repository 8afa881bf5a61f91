// comm::Store: the small key-value store every process of a run meets at
// (docs/ARCHITECTURE.md, "Core abstractions"). Ranks publish addresses, unique ids and
// heartbeats through it; the launcher, or rank 0 without one, hosts it, or
// it lives in an etcd cluster (dtrain-launch --rdzv-backend etcd).
//
// Contract shared by every implementation (MemoryStore for thread-based
// tests, TcpStore for processes, EtcdStore in etcd; tests/support/store_contract.h
// checks it):
// - Keys are strings, values are bytes. Calls are thread-safe.
// - Every call that can wait takes a timeout and throws dtrain::TimeoutError
//   naming the key(s) when it runs out; nothing waits forever.
// - Failures to reach the store throw dtrain::CommError naming the address.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::comm {

using Bytes = std::vector<std::uint8_t>;
using Duration = std::chrono::milliseconds;

inline Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

class Store {
 public:
  virtual ~Store() = default;

  // Sets key to value, replacing any previous value; wakes waiters on key.
  virtual void set(const std::string& key, const Bytes& value) = 0;

  // The value of key, waiting until it exists or timeout passes (TimeoutError).
  virtual Bytes get(const std::string& key, Duration timeout) = 0;

  // Adds delta to the integer stored at key (absent counts as 0; the value is
  // kept as decimal text) and returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;

  // Sets key to desired if its current value equals expected; an absent key
  // matches an empty `expected`. Returns the value after the call (desired on
  // success, the current value otherwise).
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;

  // Removes key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // Waits until every key exists (TimeoutError naming the missing ones).
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;

  // Whether key exists now (never waits).
  virtual bool check(const std::string& key) = 0;

  // How many keys the store holds.
  virtual std::int64_t num_keys() = 0;
};

// A view of a store whose keys all start with "<prefix>/": scopes a run, a
// restart round or a communicator, so a stale process cannot disturb another.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store)
      : prefix_(std::move(prefix) + "/"), store_(std::move(store)) {}

  void set(const std::string& key, const Bytes& value) override { store_->set(prefix_ + key, value); }
  Bytes get(const std::string& key, Duration timeout) override {
    return store_->get(prefix_ + key, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return store_->add(prefix_ + key, delta);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return store_->compare_set(prefix_ + key, expected, desired);
  }
  bool delete_key(const std::string& key) override { return store_->delete_key(prefix_ + key); }
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_->wait(full, timeout);
  }
  bool check(const std::string& key) override { return store_->check(prefix_ + key); }
  std::int64_t num_keys() override { return store_->num_keys(); }

 private:
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace dtrain::comm
