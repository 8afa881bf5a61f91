// MemoryStore: a Store inside one process, for tests that run N ranks as
// threads. All ranks share one instance (through std::shared_ptr); every call
// is thread-safe, and get/wait block on a condition variable until a set,
// add or compare_set makes their keys appear or the timeout passes.
#pragma once

#include <condition_variable>
#include <mutex>

#include "comm/store.h"
#include "comm/store_table.h"

namespace dtrain::comm {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::string& key) override;
  std::int64_t num_keys() override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;  // notified whenever a key gains a value
  StoreTable table_;                 // guarded by mu_
};

}  // namespace dtrain::comm
