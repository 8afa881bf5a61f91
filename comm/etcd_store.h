// EtcdStore: the run's Store kept in an etcd cluster (etcd's v3 API, through
// its JSON gateway: /v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/kv/deleterange,
// /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; keys and values
// base64). etcd replicates every key over its members, so no process of the
// job is the store's single point of failure (docs/launcher.md, "etcd").
//
// Endpoints: a call goes to the endpoint that answered last; when it cannot
// be reached (refused, reset, no answer within Options::attempt_timeout) or
// answers that it has no leader, the call moves on to the next one, round
// the list, until its deadline. Errors name every endpoint and what it said.
//
// Keys: Options::prefix + key ("dtrain/<run id>/..."). Values are bytes.
// add is a read and a compare-and-swap on the key's mod revision, retried
// while other clients win (etcd has no increment of its own); compare_set is
// one transaction. Waits (get, wait) poll every few milliseconds up to 50 ms.
//
// Leases: with Options::lease_ttl > 0 the store grants a lease and a thread
// of its own keeps it alive every ttl/3; the keys written by set() carry it,
// so the records of a process that dies (an agent's node record, the
// workers' MASTER_PORT) expire ttl after its last keep-alive. Counters (add)
// and compare_set keys are the job's shared state and carry no lease. The
// lease is revoked when the store is destroyed.
//
// Threading: calls are thread-safe; they share one HTTP connection under a
// mutex, released between the polls of a wait. A call that fails after etcd
// applied it (the answer lost) is retried and may apply twice, as with
// TcpStore.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cluster/env_vars.h"
#include "comm/store.h"

namespace dtrain::comm {

class EtcdStore : public Store {
 public:
  struct Options {
    std::vector<cluster::HostPort> endpoints;  // etcd's client URLs' host:port, tried in this order
    std::string prefix = "dtrain/";            // every key lives under it
    Duration connect_timeout{30'000};          // at start: keep trying the endpoints this long
    Duration timeout{15'000};                  // one call's round trips, failover included
    Duration attempt_timeout{3'000};           // one endpoint's answer to one request
    std::chrono::seconds lease_ttl{0};         // > 0: set() keys carry this client's lease
    std::function<void(const std::string&)> log;  // the lease thread's notes; default: stderr
  };

  // Reaches an endpoint (and grants the lease) within connect_timeout, or
  // throws CommError naming every endpoint and what to do.
  explicit EtcdStore(Options options);
  ~EtcdStore() override;
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::string& key) override;
  // Keys under Options::prefix.
  std::int64_t num_keys() override;

  // Removes every key that starts with `prefix` (under Options::prefix);
  // returns how many there were.
  std::int64_t delete_prefix(const std::string& prefix);

  // "etcd endpoints h1:2379,h2:2379", for messages.
  std::string describe() const;

  class Http;  // one HTTP/1.1 connection with failover (etcd_store.cpp)

 private:
  using Clock = std::chrono::steady_clock;
  struct Value;

  nlohmann::json post(const std::string& path, const std::string& body);
  std::optional<Value> range(const std::string& full_key);
  void grant_lease(Http& http, Clock::time_point deadline);
  void keep_alive();

  Options options_;
  std::mutex mu_;
  std::unique_ptr<Http> http_;  // guarded by mu_
  std::atomic<std::int64_t> lease_{0};
  std::mutex lease_mu_;
  std::condition_variable lease_cv_;
  bool stopping_ = false;  // guarded by lease_mu_
  std::thread lease_thread_;
};

// A worker's client of the run's store when DTRAIN_STORE is
// "etcd://h1:2379,h2:2379" (dtrain-launch --rdzv-backend etcd): no lease, keys
// under "dtrain/". Throws Error naming DTRAIN_STORE for a bad list, CommError
// when no endpoint answers within connect_timeout.
std::shared_ptr<EtcdStore> etcd_store_client(const std::string& address, Duration connect_timeout, Duration timeout);

}  // namespace dtrain::comm
