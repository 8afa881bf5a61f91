// Helpers for tests of comm::Store implementations: a captured server log,
// client/server options on 127.0.0.1, threads that report their exceptions,
// bounded polling, and a raw TCP connection for feeding a server bad bytes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/store_format.h"
#include "comm/tcp_store.h"
#include "comm/tcp_store_server.h"
#include "proto/store.pb.h"

namespace dtrain::testing {

inline constexpr char kStoreToken[] = "test-token-5f1c";

// The server's log lines; the server writes them on its own thread.
class LogCapture {
 public:
  comm::TcpStoreServer::LogSink sink() {
    return [this](const std::string& line) {
      std::lock_guard lock(mu_);
      lines_.push_back(line);
    };
  }
  bool contains(const std::string& text) const {
    std::lock_guard lock(mu_);
    for (const auto& l : lines_) {
      if (l.find(text) != std::string::npos) return true;
    }
    return false;
  }
  std::string all() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// Polls pred every few milliseconds; false if it still fails after timeout.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(1500)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline comm::TcpStoreServer::Options store_server_options(LogCapture& log, std::uint16_t port = 0) {
  comm::TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = kStoreToken;
  o.log = log.sink();
  return o;
}

inline comm::TcpStore::Options store_client_options(std::uint16_t port,
                                                    const std::string& token = kStoreToken) {
  comm::TcpStore::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = token;
  o.connect_timeout = std::chrono::milliseconds(1000);
  o.timeout = std::chrono::milliseconds(1000);
  return o;
}

// Runs fn(i) for i in [0, n) on n threads; returns what the ones that threw said.
inline std::vector<std::string> run_threads(int n, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        errors.push_back(fmt::format("thread {}: {}", i, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// A frame's length prefix alone, claiming n bytes follow.
inline std::string store_length_prefix(std::uint32_t n) {
  std::string out(comm::kStoreHeaderBytes, '\0');
  comm::encode_frame_length(n, reinterpret_cast<std::uint8_t*>(out.data()));
  return out;
}

// One frame as the store's wire format lays it out.
inline std::string store_frame(const std::string& payload) {
  return store_length_prefix(static_cast<std::uint32_t>(payload.size())) + payload;
}

inline std::string store_hello_frame(const std::string& token, std::uint32_t version = comm::kStoreVersion) {
  store::Request r;
  r.set_id(1);
  r.mutable_hello()->set_magic(comm::kStoreMagic);
  r.mutable_hello()->set_version(version);
  r.mutable_hello()->set_token(token);
  r.mutable_hello()->set_client("raw test socket");
  return store_frame(r.SerializeAsString());
}

// A blocking socket to 127.0.0.1:port that sends whatever it is given; reads
// give up after a second.
class RawConnection {
 public:
  explicit RawConnection(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      throw std::runtime_error("raw connection to the store failed");
    }
    timeval tv{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // Errors are ignored: the server may rightly have closed already.
  void send(const std::string& bytes) { (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

  // The next answer, or nothing when the server closed or a second passed.
  std::optional<store::Response> read_response() {
    std::uint8_t header[comm::kStoreHeaderBytes];
    if (!read_exact(header, sizeof(header))) return std::nullopt;
    std::string body(comm::decode_frame_length(header), '\0');
    if (!read_exact(reinterpret_cast<std::uint8_t*>(body.data()), body.size())) return std::nullopt;
    store::Response r;
    if (!r.ParseFromString(body)) return std::nullopt;
    return r;
  }

  // True once the server has closed its end (EOF or reset).
  bool closed_by_server() {
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool read_exact(std::uint8_t* data, std::size_t n) {
    while (n > 0) {
      const ssize_t got = ::recv(fd_, data, n, 0);
      if (got <= 0) return false;
      data += got;
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }

  int fd_;
};

}  // namespace dtrain::testing
