// TcpStore: the Store every process of a run reaches over TCP (server:
// comm/tcp_store_server.h; wire format: comm/store_format.h).
//
// Threading: calls are thread-safe and share one connection under a mutex,
// so a get or wait that is waiting holds up the other threads' calls; a
// thread that must set while another waits uses its own TcpStore.
//
// Deadlines: a call that takes a timeout may last that long plus
// Options::timeout for the round trip; other calls last at most
// Options::timeout. Socket reads and writes never block past the deadline.
// When the deadline passes without an answer the call throws TimeoutError and
// drops the connection, so a late answer cannot be mistaken for the next one.
//
// Reconnection: when the connection turns out dropped, a call reconnects once
// (sending the Hello again) and retries; if that fails too it throws
// CommError naming host:port. An add retried this way may apply twice when
// the connection dropped after the server applied it but before it answered.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "comm/store.h"

namespace dtrain::store {
class Request;
class Response;
}  // namespace dtrain::store

namespace dtrain::comm {

class TcpStore : public Store {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    std::uint16_t port = 0;
    std::string token;                   // the run's DTRAIN_TOKEN
    Duration connect_timeout{30'000};    // keep retrying to connect this long: the server may start later
    Duration timeout{30'000};            // a call's round trip (see "Deadlines" above)
    std::string client;                  // who we are, for the server's log; default "pid N on HOST"
  };

  // Connects and says hello. Throws CommError when the server cannot be
  // reached within connect_timeout or refuses the token.
  explicit TcpStore(Options options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::string& key) override;
  std::int64_t num_keys() override;

  // "host:port", for messages.
  std::string address() const;

 private:
  using Clock = std::chrono::steady_clock;

  // Sends request and returns the server's OK answer; throws TimeoutError or
  // CommError (see above). `wait` is how long the server may hold the request.
  store::Response call(store::Request& request, Duration wait, const std::string& what);
  // Connects and says hello, retrying refused connections until `deadline`.
  void connect(Clock::time_point deadline);
  void hello(Clock::time_point deadline);
  void exchange(const store::Request& request, store::Response& response, Clock::time_point deadline);
  void disconnect();

  Options options_;
  std::mutex mu_;
  int fd_ = -1;                // guarded by mu_; -1 while disconnected
  std::uint64_t next_id_ = 1;  // guarded by mu_
};

}  // namespace dtrain::comm
