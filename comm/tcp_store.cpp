#include "comm/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "comm/store_format.h"
#include "comm/store_table.h"
#include "core/error.h"
#include "proto/store.pb.h"

namespace dtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using store::Request;
using store::Response;

// The connection failed or closed under a call: the one failure worth a reconnect.
class ConnectionLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The deadline passed while the socket was still waiting.
class DeadlinePassed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr auto kFirstConnectPause = std::chrono::milliseconds(20);
constexpr auto kMaxConnectPause = std::chrono::milliseconds(500);

std::string errno_text(int err) { return std::strerror(err); }

int poll_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, INT_MAX));
}

// Returns once fd is ready for `events` (or has an error the next call reports).
void wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc > 0) return;
    if (rc == 0) throw DeadlinePassed("deadline passed");
    if (errno != EINTR) throw ConnectionLost("poll: " + errno_text(errno));
  }
}

void write_all(int fd, const std::uint8_t* data, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    // MSG_NOSIGNAL: a closed peer is an error to report, not a SIGPIPE.
    const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL);
    if (sent > 0) {
      data += sent;
      n -= static_cast<std::size_t>(sent);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd, POLLOUT, deadline);
    } else if (errno != EINTR) {
      throw ConnectionLost("send: " + errno_text(errno));
    }
  }
}

void read_exact(int fd, std::uint8_t* data, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got > 0) {
      data += got;
      n -= static_cast<std::size_t>(got);
    } else if (got == 0) {
      throw ConnectionLost("the server closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd, POLLIN, deadline);
    } else if (errno != EINTR) {
      throw ConnectionLost("recv: " + errno_text(errno));
    }
  }
}

// One non-blocking connect to each resolved address in turn; returns the
// first socket that connects. Name resolution uses the system resolver and
// its own timeouts (numeric addresses need none).
int connect_once(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw ConnectionLost(std::string("cannot resolve the host: ") + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  std::string last = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = "socket: " + errno_text(errno);
      continue;
    }
    int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      try {
        wait_ready(fd, POLLOUT, deadline);
      } catch (...) {
        ::close(fd);
        throw;
      }
      socklen_t len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    const int one = 1;  // TCP_NODELAY: small frames, answered at once
    if (err == 0 && ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0) return fd;
    last = err != 0 ? errno_text(err) : "setsockopt(TCP_NODELAY): " + errno_text(errno);
    ::close(fd);
  }
  throw ConnectionLost(last);
}

std::string default_client_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  return fmt::format("pid {} on {}", ::getpid(), host);
}

// Tells the server how long it may hold a get or wait: what is left until wait_until.
void set_wait(Request& request, Clock::time_point wait_until) {
  const auto left = std::max<std::int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(wait_until - Clock::now()).count());
  if (request.has_get()) request.mutable_get()->set_timeout_ms(left);
  if (request.has_wait()) request.mutable_wait()->set_timeout_ms(left);
}

}  // namespace

TcpStore::TcpStore(Options options) : options_(std::move(options)) {
  if (options_.client.empty()) options_.client = default_client_name();
  options_.connect_timeout = clamp_store_wait(options_.connect_timeout);
  options_.timeout = clamp_store_wait(options_.timeout);
  std::lock_guard lock(mu_);
  connect(Clock::now() + options_.connect_timeout);
}

TcpStore::~TcpStore() { disconnect(); }

std::string TcpStore::address() const { return fmt::format("{}:{}", options_.host, options_.port); }

void TcpStore::connect(Clock::time_point deadline) {
  auto pause = kFirstConnectPause;
  std::string last;
  for (;;) {
    try {
      fd_ = connect_once(options_.host, options_.port, deadline);
      hello(deadline);
      return;
    } catch (const ConnectionLost& e) {
      last = e.what();
    } catch (const DeadlinePassed&) {
      last = "timed out";
    }
    disconnect();
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kMaxConnectPause);
  }
  throw CommError(fmt::format(
      "cannot reach the store at {} ({}); check DTRAIN_STORE and that the store's host (the "
      "launcher, or rank 0) is up and reachable",
      address(), last));
}

void TcpStore::hello(Clock::time_point deadline) {
  Request request;
  request.set_id(next_id_++);
  store::Hello* h = request.mutable_hello();
  h->set_magic(kStoreMagic);
  h->set_version(kStoreVersion);
  h->set_token(options_.token);
  h->set_client(options_.client);
  Response response;
  exchange(request, response, deadline);
  if (response.status() == Response::STATUS_OK) return;
  disconnect();
  if (response.status() == Response::STATUS_REFUSED) {
    throw CommError(fmt::format(
        "the store at {} refused this process: its token (DTRAIN_TOKEN) does not match the run's "
        "store; start it with the run's DTRAIN_TOKEN, or point DTRAIN_STORE at this run's store",
        address()));
  }
  throw CommError(fmt::format("the store at {} refused the connection: {}", address(), response.message()));
}

void TcpStore::exchange(const Request& request, Response& response, Clock::time_point deadline) {
  const std::size_t size = request.ByteSizeLong();
  if (size > kStoreMaxFrameBytes) {
    throw CommError(fmt::format("a store request of {} bytes exceeds the limit of {} bytes; keep large "
                                "data out of the store", size, kStoreMaxFrameBytes));
  }
  std::vector<std::uint8_t> frame(kStoreHeaderBytes + size);
  encode_frame_length(static_cast<std::uint32_t>(size), frame.data());
  request.SerializeToArray(frame.data() + kStoreHeaderBytes, static_cast<int>(size));
  write_all(fd_, frame.data(), frame.size(), deadline);

  std::uint8_t header[kStoreHeaderBytes];
  read_exact(fd_, header, sizeof(header), deadline);
  const std::uint32_t answer_size = decode_frame_length(header);
  if (answer_size > kStoreMaxFrameBytes) {
    throw ConnectionLost(fmt::format("the server sent a frame of {} bytes, above the limit", answer_size));
  }
  frame.resize(answer_size);
  read_exact(fd_, frame.data(), answer_size, deadline);
  if (!response.ParseFromArray(frame.data(), static_cast<int>(answer_size)) ||
      response.id() != request.id()) {
    // Either is a garbled stream; a fresh connection starts clean.
    throw ConnectionLost("the server's answer does not match the request");
  }
}

void TcpStore::disconnect() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Response TcpStore::call(Request& request, Duration wait, const std::string& what) {
  std::lock_guard lock(mu_);
  wait = clamp_store_wait(wait);
  const auto wait_until = Clock::now() + wait;
  const auto deadline = wait_until + options_.timeout;
  std::optional<Response> answer;
  std::string lost;
  for (int attempt = 0; attempt < 2 && !answer; ++attempt) {
    try {
      if (fd_ < 0) connect(std::min(deadline, Clock::now() + options_.connect_timeout));
      request.set_id(next_id_++);
      set_wait(request, wait_until);
      Response response;
      exchange(request, response, deadline);
      answer = std::move(response);
    } catch (const ConnectionLost& e) {
      disconnect();
      lost = e.what();
    } catch (const DeadlinePassed&) {
      disconnect();  // a late answer must not be read as the next call's
      throw TimeoutError(fmt::format(
          "the store at {} did not answer the {} within {} ms; is the store's host overloaded or hung?",
          address(), what, (wait + options_.timeout).count()));
    }
  }
  if (!answer) {
    throw CommError(fmt::format("lost the connection to the store at {} twice during the {} ({}); is "
                                "the store's host (the launcher, or rank 0) still up?",
                                address(), what, lost));
  }
  switch (answer->status()) {
    case Response::STATUS_OK:
      return std::move(*answer);
    case Response::STATUS_TIMEOUT: {
      std::vector<std::string> missing(answer->missing_keys().begin(), answer->missing_keys().end());
      throw TimeoutError(fmt::format(
          "store at {}: the {} timed out after {} ms; still missing {} (is the process that sets "
          "them running?)", address(), what, wait.count(), quote_keys(missing)));
    }
    default:
      throw CommError(fmt::format("store at {}: the {} failed: {}", address(), what, answer->message()));
  }
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  Request r;
  r.mutable_set()->set_key(key);
  r.mutable_set()->set_value(value.data(), value.size());
  call(r, Duration(0), fmt::format("set of key '{}'", key));
}

Bytes TcpStore::get(const std::string& key, Duration timeout) {
  Request r;
  r.mutable_get()->set_key(key);
  return to_bytes(call(r, timeout, fmt::format("get of key '{}'", key)).value());
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  Request r;
  r.mutable_add()->set_key(key);
  r.mutable_add()->set_delta(delta);
  return call(r, Duration(0), fmt::format("add to key '{}'", key)).number();
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Request r;
  auto* c = r.mutable_compare_set();
  c->set_key(key);
  c->set_expected(expected.data(), expected.size());
  c->set_desired(desired.data(), desired.size());
  return to_bytes(call(r, Duration(0), fmt::format("compare_set of key '{}'", key)).value());
}

bool TcpStore::delete_key(const std::string& key) {
  Request r;
  r.mutable_delete_key()->set_key(key);
  return call(r, Duration(0), fmt::format("delete of key '{}'", key)).flag();
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  Request r;
  store::WaitRequest* w = r.mutable_wait();  // set even for no keys, which the server answers at once
  for (const auto& k : keys) w->add_keys(k);
  call(r, timeout, fmt::format("wait for {}", quote_keys(keys)));
}

bool TcpStore::check(const std::string& key) {
  Request r;
  r.mutable_check()->set_key(key);
  return call(r, Duration(0), fmt::format("check of key '{}'", key)).flag();
}

std::int64_t TcpStore::num_keys() {
  Request r;
  r.mutable_num_keys();
  return call(r, Duration(0), "num_keys").number();
}

}  // namespace dtrain::comm
