#include "telemetry/metrics_http.h"

#include <chrono>
#include <thread>
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::telemetry {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr std::size_t kMaxRequest = 8192;
constexpr auto kRequestTimeout = std::chrono::seconds(5);

std::string response(int code, const char* reason, const std::string& type, const std::string& body) {
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", code,
                     reason, type, body.size(), body);
}

// The answer to a request whose first line is `line` ("GET /metrics HTTP/1.1").
std::string answer(const std::string& line, const MetricsServer::Render& render) {
  const auto sp1 = line.find(' ');
  const auto sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) return response(400, "Bad Request", "text/plain", "bad request\n");
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") return response(405, "Method Not Allowed", "text/plain", "GET only\n");
  if (path != "/metrics") return response(404, "Not Found", "text/plain", "try /metrics\n");
  std::string body = render();
  if (method == "HEAD") body.clear();
  return response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body);
}

// One connection: read the request head, write the answer, close.
struct Session : std::enable_shared_from_this<Session> {
  Session(tcp::socket s, const MetricsServer::Render& r)
      : socket(std::move(s)), timer(socket.get_executor()), render(r) {}

  void start() {
    auto self = shared_from_this();
    timer.expires_after(kRequestTimeout);
    timer.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->socket.close();
    });
    asio::async_read_until(socket, asio::dynamic_buffer(request, kMaxRequest), "\r\n\r\n",
                           [self](const boost::system::error_code& ec, std::size_t) { self->on_request(ec); });
  }

  void on_request(const boost::system::error_code& ec) {
    if (ec) {
      timer.cancel();
      return;  // closed early, too large or too slow: nothing to answer
    }
    const std::string line = request.substr(0, request.find("\r\n"));
    reply = answer(line, render);
    auto self = shared_from_this();
    asio::async_write(socket, asio::buffer(reply), [self](const boost::system::error_code&, std::size_t) {
      boost::system::error_code ignored;
      self->socket.shutdown(tcp::socket::shutdown_both, ignored);
      self->socket.close(ignored);
      self->timer.cancel();
    });
  }

  tcp::socket socket;
  asio::steady_timer timer;
  const MetricsServer::Render& render;
  std::string request;
  std::string reply;
};

}  // namespace

struct MetricsServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  Render render;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) std::make_shared<Session>(std::move(socket), render)->start();
      accept();
    });
  }
};

MetricsServer::MetricsServer(const std::string& host, int port, Render render) : impl_(std::make_unique<Impl>()) {
  impl_->render = std::move(render);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) throw Error(fmt::format("metrics: '{}' is not an IP address: use e.g. 127.0.0.1 or 0.0.0.0", host));
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error(fmt::format("metrics: cannot listen on {}:{}: {}; choose another --metrics-port (0 turns /metrics off)",
                            host, port, ec.message()));
  }
  impl_->accept();
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

MetricsServer::~MetricsServer() {
  impl_->io.stop();
  impl_->thread.join();
}

int MetricsServer::port() const { return impl_->acceptor.local_endpoint().port(); }

}  // namespace dtrain::telemetry
