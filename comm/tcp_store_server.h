// TcpStoreServer: the server side of TcpStore (wire format: comm/store_format.h,
// proto/store.proto). The launcher hosts one per run; without a launcher, rank 0.
//
// Threading: the constructor binds, listens and starts one server thread that
// owns every connection and the data; the destructor (or stop()) closes them
// and joins it. The public methods may be called from any thread except the
// log sink's. Gets and waits never block that thread: a waiter is parked until
// its keys are set or its timer fires, and is dropped if its client vanishes.
//
// Every connection must first prove the run's token; a wrong one is answered
// with STATUS_REFUSED and closed. Malformed, oversized or truncated frames and
// vanished peers close only their own connection, with a line in the log.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dtrain::comm {

class TcpStoreServer {
 public:
  using LogSink = std::function<void(const std::string&)>;

  struct Options {
    std::string host = "0.0.0.0";  // the address (or name) to bind
    std::uint16_t port = 0;        // 0: a free port, see port()
    std::string token;             // required: clients must present it
    LogSink log;                   // called on the server thread; empty: stderr, "dtrain store: "
  };

  // Throws CommError when the token is empty or the address cannot be bound.
  explicit TcpStoreServer(Options options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The bound port (the chosen one when Options::port was 0).
  std::uint16_t port() const;

  // "host:port" as bound, for messages.
  std::string address() const;

  // Closes every connection and joins the server thread. Idempotent.
  void stop();

  // Closes every client connection but keeps the data and keeps listening,
  // as a network drop would: clients reconnect on their next call.
  void close_connections();

  // Open connections and parked gets/waits right now (for monitoring and tests).
  std::size_t connection_count() const;
  std::size_t waiter_count() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether something already listens on TCP `port` of this machine (on any
// address): binding it for a moment tells. A launcher's store, or a clash.
// Throws IoError when no socket can be set up to try.
bool tcp_port_in_use(int port);

}  // namespace dtrain::comm
