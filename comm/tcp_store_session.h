// Internal to TcpStoreServer (comm/tcp_store_server.cpp): one client
// connection. A session reads frames (comm/store_format.h), checks the Hello,
// hands each later request to its Host and writes the answers back.
//
// Threading: everything here runs on the server thread. Pending Asio handlers
// hold the session through shared_from_this; the Host keeps a reference until
// forget(). A session serves one request at a time: a request parked as a
// StoreWaiter must be answered (or dropped) before the next one is read as
// valid, since TcpStore never sends two at once.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>

#include "comm/store_format.h"
#include "proto/store.pb.h"

namespace dtrain::comm {

class TcpStoreSession;

// A get or wait parked until its keys exist or its timer fires. `session` is
// reset once it is answered or dropped, which breaks the session <-> waiter cycle.
struct StoreWaiter {
  explicit StoreWaiter(boost::asio::io_context& io) : timer(io) {}
  std::shared_ptr<TcpStoreSession> session;
  std::uint64_t request_id = 0;
  bool is_get = false;  // a get answers with the value, a wait with nothing
  std::vector<std::string> keys;
  std::string watching;  // the one missing key it is listed under
  boost::asio::steady_timer timer;
  bool done = false;
};

class TcpStoreSession : public std::enable_shared_from_this<TcpStoreSession> {
 public:
  // What a session needs from the server that owns it.
  class Host {
   public:
    virtual ~Host() = default;
    virtual void log(const std::string& line) = 0;
    virtual const std::string& token() const = 0;
    // The answer to an authenticated request, or nothing when it was parked
    // (the Host answers later through send()).
    virtual std::optional<store::Response> handle(const std::shared_ptr<TcpStoreSession>& session,
                                                  const store::Request& request) = 0;
    // The session closed: drop its waiter and release it.
    virtual void forget(TcpStoreSession& session) = 0;
  };

  TcpStoreSession(Host& host, boost::asio::ip::tcp::socket socket, std::uint64_t id);

  void start() { read_header(); }
  std::uint64_t id() const { return id_; }
  const std::shared_ptr<StoreWaiter>& waiter() const { return waiter_; }
  void set_waiter(std::shared_ptr<StoreWaiter> w) { waiter_ = std::move(w); }
  void send(const store::Response& response);
  // Closes the socket (once) and tells the Host; logs `why` unless empty.
  void close(const std::string& why);

 private:
  void read_header();
  void read_body(std::uint32_t size);
  void on_frame();
  bool on_hello(const store::Request& request);
  void on_read_error(const boost::system::error_code& ec, std::size_t got, std::size_t wanted);
  // Answers with `reply`, logs `log_line`, and closes once the answer is written.
  void reject(std::uint64_t id, store::Response::Status status, const std::string& reply,
              const std::string& log_line);
  void write_next();
  std::string describe_waiter() const;

  Host& host_;
  boost::asio::ip::tcp::socket socket_;
  std::uint64_t id_;
  std::string peer_;  // "ip:port (client description)", for log lines
  std::array<std::uint8_t, kStoreHeaderBytes> header_{};
  std::unique_ptr<std::uint8_t[]> body_;
  std::uint32_t body_size_ = 0;
  std::deque<std::vector<std::uint8_t>> out_;
  std::shared_ptr<StoreWaiter> waiter_;
  bool authenticated_ = false;
  bool close_after_write_ = false;
  bool closed_ = false;
};

// Helpers shared by the session and the server.
store::Response make_store_response(std::uint64_t id, store::Response::Status status,
                                    const std::string& message = {});
// A peer-supplied string made safe for one log line.
std::string printable_for_log(const std::string& s, std::size_t max = 80);

}  // namespace dtrain::comm
