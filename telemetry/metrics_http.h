// A minimal HTTP/1.0-style server for Prometheus scrapes (Boost.Asio, one
// thread of its own): GET /metrics answers 200 with the text `render()`
// returns (Content-Type: text/plain; version=0.0.4), any other path 404,
// anything else 400/405; each connection carries one request and is closed.
// Requests are bounded (8 KiB of headers, 5 s to arrive).
//
// Threading: render() runs on the server's thread, so it must be safe to call
// there (take a lock on what it reads). The destructor stops the thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dtrain::telemetry {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;

  // Listens on host:port (port 0: a free port, see port()). Throws
  // dtrain::Error naming the address when it cannot be bound.
  MetricsServer(const std::string& host, int port, Render render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::telemetry
