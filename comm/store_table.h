// StoreTable: the data of a store and the meaning of comm/store.h's
// operations on it, without locking or waiting. MemoryStore and
// TcpStoreServer both keep one, so the two cannot drift apart.
// Not thread-safe: the owner serialises access (a mutex, or one thread).
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/store.h"
#include "core/error.h"

namespace dtrain::comm {

// The longest a get or wait may wait: beyond any rendezvous, and far enough
// from the clock's range that now + timeout cannot overflow.
inline constexpr Duration kMaxStoreWait = std::chrono::hours(24 * 7);
inline Duration clamp_store_wait(Duration d) { return std::min(d, kMaxStoreWait); }

class StoreTable {
 public:
  void set(const std::string& key, const Bytes& value) { data_[key] = value; }

  const Bytes* find(const std::string& key) const {
    auto it = data_.find(key);
    return it == data_.end() ? nullptr : &it->second;
  }

  // Throws CommError when key holds something other than decimal text or the
  // sum overflows: a counter key shared with other data is a caller's bug.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    std::int64_t current = 0;
    if (const Bytes* value = find(key)) {
      const char* first = reinterpret_cast<const char*>(value->data());
      const char* last = first + value->size();
      auto [end, ec] = std::from_chars(first, last, current);
      if (value->empty() || ec != std::errc() || end != last) {
        throw CommError(fmt::format(
            "store key '{}' holds '{}', not a decimal integer; add needs a key used only as a counter",
            key, to_string(*value).substr(0, 64)));
      }
    }
    std::int64_t result = 0;
    if (__builtin_add_overflow(current, delta, &result)) {
      throw CommError(fmt::format("store key '{}': adding {} to {} overflows int64", key, delta, current));
    }
    set(key, to_bytes(std::to_string(result)));
    return result;
  }

  // Returns whether desired was stored; `after` receives the value after the call.
  bool compare_set(const std::string& key, const Bytes& expected, const Bytes& desired,
                   Bytes& after) {
    const Bytes* current = find(key);
    const bool matches = current == nullptr ? expected.empty() : *current == expected;
    if (!matches) {
      after = current == nullptr ? Bytes{} : *current;
      return false;
    }
    set(key, desired);
    after = desired;
    return true;
  }

  bool erase(const std::string& key) { return data_.erase(key) > 0; }

  std::int64_t size() const { return static_cast<std::int64_t>(data_.size()); }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) {
      if (find(k) == nullptr) out.push_back(k);
    }
    return out;
  }

 private:
  std::unordered_map<std::string, Bytes> data_;
};

// "'a', 'b'": keys as error messages quote them.
inline std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out += ", ";
    out += "'" + k + "'";
  }
  return out;
}

}  // namespace dtrain::comm
