#include "comm/tcp_store_session.h"

#include <algorithm>

#include <fmt/format.h>

namespace dtrain::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using store::Request;
using store::Response;

namespace {

// Compares in time independent of where the strings differ, so a client
// cannot learn the token a byte at a time from how fast it is refused.
bool same_token(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::string endpoint_text(const tcp::socket& socket) {
  error_code ec;
  const tcp::endpoint remote = socket.remote_endpoint(ec);
  if (ec) return "an unknown peer";
  const auto& a = remote.address();
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), remote.port())
                   : fmt::format("{}:{}", a.to_string(), remote.port());
}

}  // namespace

Response make_store_response(std::uint64_t id, Response::Status status, const std::string& message) {
  Response r;
  r.set_id(id);
  r.set_status(status);
  if (!message.empty()) r.set_message(message);
  return r;
}

std::string printable_for_log(const std::string& s, std::size_t max) {
  std::string out = s.substr(0, max);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return s.size() > max ? out + "..." : out;
}

TcpStoreSession::TcpStoreSession(Host& host, tcp::socket socket, std::uint64_t id)
    : host_(host), socket_(std::move(socket)), id_(id), peer_(endpoint_text(socket_)) {}

void TcpStoreSession::read_header() {
  if (closed_ || close_after_write_) return;
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(header_), [self](const error_code& ec, std::size_t got) {
    if (ec) return self->on_read_error(ec, got, kStoreHeaderBytes);
    self->read_body(decode_frame_length(self->header_.data()));
  });
}

void TcpStoreSession::read_body(std::uint32_t size) {
  const std::uint32_t limit = authenticated_ ? kStoreMaxFrameBytes : kStoreMaxHelloFrameBytes;
  if (size > limit) {
    return close(fmt::format("{} sent a frame of {} bytes, above the limit of {}{}; closed its connection",
                             peer_, size, limit, authenticated_ ? "" : " before its hello"));
  }
  // Not zero-filled: a large frame's pages are touched only as its bytes arrive.
  body_ = std::make_unique_for_overwrite<std::uint8_t[]>(size);
  body_size_ = size;
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(body_.get(), size),
                   [self, size](const error_code& ec, std::size_t got) {
                     if (ec) return self->on_read_error(ec, kStoreHeaderBytes + got, kStoreHeaderBytes + size);
                     self->on_frame();
                   });
}

void TcpStoreSession::on_frame() {
  Request request;
  const bool parsed = request.ParseFromArray(body_.get(), static_cast<int>(body_size_));
  body_.reset();
  if (!parsed) {
    return reject(0, Response::STATUS_ERROR,
                  "the frame is not a store request; do client and server run the same dtrain build?",
                  fmt::format("{} sent {} bytes that do not parse as a store request; closed its connection",
                              peer_, body_size_));
  }
  if (!authenticated_) {
    if (on_hello(request)) read_header();
    return;
  }
  if (waiter_) {
    return close(fmt::format("{} sent a request while {} was still waiting (the protocol is one at a "
                             "time); closed its connection", peer_, describe_waiter()));
  }
  if (auto response = host_.handle(shared_from_this(), request)) send(*response);
  read_header();
}

bool TcpStoreSession::on_hello(const Request& request) {
  if (!request.has_hello()) {
    reject(request.id(), Response::STATUS_ERROR, "the first request on a connection must be a hello",
           fmt::format("{} sent a request before its hello; closed its connection", peer_));
    return false;
  }
  const store::Hello& hello = request.hello();
  if (!hello.client().empty()) peer_ += " (" + printable_for_log(hello.client()) + ")";
  if (hello.magic() != kStoreMagic || hello.version() != kStoreVersion) {
    const std::string reply = fmt::format(
        "store protocol mismatch: the client speaks magic {:#x} version {}, the server magic {:#x} "
        "version {}; run the same dtrain build on every node",
        hello.magic(), hello.version(), kStoreMagic, kStoreVersion);
    reject(request.id(), Response::STATUS_ERROR, reply, fmt::format("{}: {}", peer_, reply));
    return false;
  }
  if (!same_token(hello.token(), host_.token())) {
    reject(request.id(), Response::STATUS_REFUSED, "the token does not match this run's store",
           fmt::format("refused {}: its token does not match this run's (a process of another run, "
                       "or a stale DTRAIN_TOKEN?)", peer_));
    return false;
  }
  authenticated_ = true;
  send(make_store_response(request.id(), Response::STATUS_OK));
  return true;
}

void TcpStoreSession::on_read_error(const error_code& ec, std::size_t got, std::size_t wanted) {
  if (closed_) return;  // our own close() aborted the read
  const bool eof = ec == asio::error::eof;
  std::string why;
  if (eof && got == 0 && !authenticated_) {
    why = fmt::format("{} closed its connection before sending a hello", peer_);
  } else if (eof && got == 0 && waiter_) {
    why = fmt::format("{} vanished while {} was waiting; dropped it", peer_, describe_waiter());
  } else if (eof && got > 0) {
    why = fmt::format("{} closed its connection in the middle of a frame ({} of {} bytes)", peer_, got,
                      wanted);
  } else if (!eof) {
    why = fmt::format("{}: connection lost ({}){}", peer_, ec.message(),
                      waiter_ ? "; dropped " + describe_waiter() : "");
  }
  close(why);  // `why` stays empty for a client that simply finished
}

void TcpStoreSession::reject(std::uint64_t id, Response::Status status, const std::string& reply,
                             const std::string& log_line) {
  host_.log(log_line);
  close_after_write_ = true;
  send(make_store_response(id, status, reply));
}

void TcpStoreSession::send(const Response& response) {
  if (closed_) return;
  const std::size_t size = response.ByteSizeLong();
  std::vector<std::uint8_t> frame(kStoreHeaderBytes + size);
  encode_frame_length(static_cast<std::uint32_t>(size), frame.data());
  response.SerializeToArray(frame.data() + kStoreHeaderBytes, static_cast<int>(size));
  out_.push_back(std::move(frame));
  if (out_.size() == 1) write_next();
}

void TcpStoreSession::write_next() {
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(out_.front()), [self](const error_code& ec, std::size_t) {
    if (self->closed_) return;
    if (ec) {
      // A peer that was being turned away anyway needs no second log line.
      return self->close(self->close_after_write_
                             ? std::string()
                             : fmt::format("{}: sending an answer failed ({}); closed its connection",
                                           self->peer_, ec.message()));
    }
    self->out_.pop_front();
    if (!self->out_.empty()) {
      self->write_next();
    } else if (self->close_after_write_) {
      self->close("");
    }
  });
}

void TcpStoreSession::close(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  if (!why.empty()) host_.log(why);
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  // After this only a running handler's `self` may still keep the session alive.
  host_.forget(*this);
}

std::string TcpStoreSession::describe_waiter() const {
  if (!waiter_) return "nothing";
  return waiter_->is_get ? fmt::format("a get of '{}'", printable_for_log(waiter_->keys.front()))
                         : fmt::format("a wait for {} keys", waiter_->keys.size());
}

}  // namespace dtrain::comm
