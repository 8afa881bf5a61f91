#include "comm/tcp_store_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <future>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "comm/store_table.h"
#include "comm/tcp_store_session.h"
#include "core/error.h"
#include "core/syscall.h"

namespace dtrain::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using store::Request;
using store::Response;
using SessionPtr = std::shared_ptr<TcpStoreSession>;
using WaiterPtr = std::shared_ptr<StoreWaiter>;

namespace {

// After a failed accept (out of descriptors, say), so the loop does not spin.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

}  // namespace

// The data, the waiters and every connection; all of it touched only on the
// server thread, except the atomics and the thread-safe entry points.
class TcpStoreServer::Impl : public TcpStoreSession::Host {
 public:
  explicit Impl(Options options);
  ~Impl() override { stop(); }

  void stop();
  void close_connections();
  std::uint16_t port() const { return port_; }
  std::string address() const { return fmt::format("{}:{}", options_.host, port_); }
  std::size_t connection_count() const { return connection_count_.load(); }
  std::size_t waiter_count() const { return waiter_count_.load(); }

  // TcpStoreSession::Host, on the server thread.
  void log(const std::string& line) override { options_.log(line); }
  const std::string& token() const override { return options_.token; }
  std::optional<Response> handle(const SessionPtr& session, const Request& request) override;
  void forget(TcpStoreSession& session) override;

 private:
  void listen();
  void run();
  void accept_next();
  void close_all();
  std::optional<Response> park(const SessionPtr& session, std::uint64_t id, bool is_get,
                               std::vector<std::string> keys, std::int64_t timeout_ms);
  void notify(const std::string& key);
  void advance(const WaiterPtr& w);
  void on_timeout(const WaiterPtr& w);
  void finish(const WaiterPtr& w, const Response& response);
  void retire(const WaiterPtr& w);
  void list(const WaiterPtr& w, const std::string& key);
  void unlist(const WaiterPtr& w);
  static Response timeout_response(std::uint64_t id, const std::vector<std::string>& missing);

  Options options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::atomic<std::size_t> connection_count_{0};
  std::atomic<std::size_t> waiter_count_{0};

  // Server thread only.
  std::uint64_t next_session_id_ = 1;
  std::unordered_map<std::uint64_t, SessionPtr> sessions_;
  std::unordered_map<std::string, std::vector<WaiterPtr>> waiters_;  // by the key they wait for
  StoreTable table_;
};

TcpStoreServer::Impl::Impl(Options options)
    : options_(std::move(options)), acceptor_(io_), accept_retry_(io_) {
  if (options_.token.empty()) {
    throw CommError("store server: the token is empty, which would admit any process; pass the "
                    "run's token (DTRAIN_TOKEN)");
  }
  if (!options_.log) {
    options_.log = [](const std::string& line) { fmt::print(stderr, "dtrain store: {}\n", line); };
  }
  listen();
  accept_next();
  thread_ = std::thread([this] { run(); });
}

void TcpStoreServer::Impl::listen() {
  error_code ec;
  tcp::endpoint endpoint(asio::ip::make_address(options_.host, ec), options_.port);
  if (ec) {  // a name such as "localhost": bind its first address, IPv4 when it has one
    tcp::resolver resolver(io_);
    auto found = resolver.resolve(tcp::v4(), options_.host, std::to_string(options_.port), ec);
    if (ec || found.empty()) found = resolver.resolve(options_.host, std::to_string(options_.port), ec);
    if (ec || found.empty()) {
      throw CommError(fmt::format("store server: cannot listen on '{}': {}; pass an address such as "
                                  "0.0.0.0", options_.host, ec ? ec.message() : "no address"));
    }
    endpoint = found.begin()->endpoint();
  }
  auto fail = [&](const char* step) {
    return CommError(fmt::format("store server: cannot {} {}:{}: {}; is the port taken? (port 0 picks a "
                                 "free one)", step, options_.host, options_.port, ec.message()));
  };
  acceptor_.open(endpoint.protocol(), ec);
  if (ec) throw fail("open a socket for");
  // Lets a restarted server take its port back while old connections sit in TIME_WAIT.
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor_.bind(endpoint, ec);
  if (ec) throw fail("bind");
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw fail("listen on");
  port_ = acceptor_.local_endpoint().port();
}

void TcpStoreServer::Impl::run() {
  // A handler that throws must not take the run's rendezvous down with it;
  // io_context::run may be called again after an exception.
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      log(fmt::format("internal error (still serving): {}", e.what()));
    }
  }
}

void TcpStoreServer::Impl::stop() {
  if (stopped_.exchange(true) || !thread_.joinable()) return;
  asio::post(io_, [this] {
    error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
    close_all();
  });
  thread_.join();  // run() returns once the cancelled handlers have drained
}

void TcpStoreServer::Impl::close_connections() {
  if (stopped_) return;
  std::promise<void> done;
  asio::post(io_, [this, &done] {
    log(fmt::format("closing all {} client connections on request", sessions_.size()));
    close_all();
    done.set_value();
  });
  done.get_future().wait();
}

void TcpStoreServer::Impl::close_all() {
  std::vector<SessionPtr> open;
  for (const auto& [id, session] : sessions_) open.push_back(session);
  for (const auto& session : open) session->close("");
}

void TcpStoreServer::Impl::accept_next() {
  acceptor_.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || stopped_) return;
    if (ec) {
      log(fmt::format("accepting a connection failed ({}); retrying shortly", ec.message()));
      accept_retry_.expires_after(kAcceptRetry);
      accept_retry_.async_wait([this](const error_code& e) {
        if (!e) accept_next();
      });
      return;
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    // Finds peers whose host died without closing, so their waiters go too.
    socket.set_option(asio::socket_base::keep_alive(true), ignored);
    auto session = std::make_shared<TcpStoreSession>(*this, std::move(socket), next_session_id_++);
    sessions_.emplace(session->id(), session);
    connection_count_ = sessions_.size();
    session->start();
    accept_next();
  });
}

std::optional<Response> TcpStoreServer::Impl::handle(const SessionPtr& session, const Request& r) {
  Response out = make_store_response(r.id(), Response::STATUS_OK);
  try {
    switch (r.op_case()) {
      case Request::kSet:
        table_.set(r.set().key(), to_bytes(r.set().value()));
        notify(r.set().key());
        break;
      case Request::kGet:
        if (const Bytes* value = table_.find(r.get().key())) {
          out.set_value(value->data(), value->size());
          break;
        }
        return park(session, r.id(), true, {r.get().key()}, r.get().timeout_ms());
      case Request::kAdd:
        out.set_number(table_.add(r.add().key(), r.add().delta()));
        notify(r.add().key());
        break;
      case Request::kCompareSet: {
        const auto& c = r.compare_set();
        Bytes after;
        if (table_.compare_set(c.key(), to_bytes(c.expected()), to_bytes(c.desired()), after)) {
          notify(c.key());
        }
        out.set_value(after.data(), after.size());
        break;
      }
      case Request::kDeleteKey:
        out.set_flag(table_.erase(r.delete_key().key()));
        break;
      case Request::kWait: {
        std::vector<std::string> keys(r.wait().keys().begin(), r.wait().keys().end());
        if (table_.missing(keys).empty()) break;
        return park(session, r.id(), false, std::move(keys), r.wait().timeout_ms());
      }
      case Request::kCheck:
        out.set_flag(table_.find(r.check().key()) != nullptr);
        break;
      case Request::kNumKeys:
        out.set_number(table_.size());
        break;
      case Request::kHello:
        return make_store_response(r.id(), Response::STATUS_ERROR, "this connection already said hello");
      case Request::OP_NOT_SET:
        return make_store_response(r.id(), Response::STATUS_ERROR,
                                   "the request names no operation; is the client a newer dtrain build?");
    }
  } catch (const CommError& e) {
    return make_store_response(r.id(), Response::STATUS_ERROR, e.what());
  }
  return out;
}

void TcpStoreServer::Impl::forget(TcpStoreSession& session) {
  if (WaiterPtr w = session.waiter()) {
    unlist(w);
    retire(w);
  }
  sessions_.erase(session.id());
  connection_count_ = sessions_.size();
}

std::optional<Response> TcpStoreServer::Impl::park(const SessionPtr& session, std::uint64_t id,
                                                   bool is_get, std::vector<std::string> keys,
                                                   std::int64_t timeout_ms) {
  const std::vector<std::string> missing = table_.missing(keys);
  if (timeout_ms <= 0) return timeout_response(id, missing);
  auto w = std::make_shared<StoreWaiter>(io_);
  w->session = session;
  w->request_id = id;
  w->is_get = is_get;
  w->keys = std::move(keys);
  w->timer.expires_after(std::chrono::milliseconds(std::min(timeout_ms, kMaxStoreWait.count())));
  w->timer.async_wait([this, w](const error_code& ec) {
    if (!ec) on_timeout(w);
  });
  session->set_waiter(w);
  ++waiter_count_;
  list(w, missing.front());
  return std::nullopt;
}

// Each waiter is listed under one missing key at a time; when that key
// appears, advance() either answers it or lists it under the next missing one.
void TcpStoreServer::Impl::notify(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<WaiterPtr> woken = std::move(it->second);
  waiters_.erase(it);
  for (const auto& w : woken) {
    if (!w->done) advance(w);
  }
}

void TcpStoreServer::Impl::advance(const WaiterPtr& w) {
  const std::vector<std::string> missing = table_.missing(w->keys);
  if (!missing.empty()) return list(w, missing.front());
  Response ok = make_store_response(w->request_id, Response::STATUS_OK);
  if (w->is_get) {
    const Bytes& value = *table_.find(w->keys.front());
    ok.set_value(value.data(), value.size());
  }
  finish(w, ok);
}

void TcpStoreServer::Impl::on_timeout(const WaiterPtr& w) {
  if (w->done) return;
  unlist(w);
  finish(w, timeout_response(w->request_id, table_.missing(w->keys)));
}

void TcpStoreServer::Impl::finish(const WaiterPtr& w, const Response& response) {
  SessionPtr session = w->session;
  retire(w);
  if (session) session->send(response);
}

void TcpStoreServer::Impl::retire(const WaiterPtr& w) {
  w->done = true;
  w->timer.cancel();
  if (w->session) {
    w->session->set_waiter(nullptr);
    w->session.reset();
  }
  --waiter_count_;
}

void TcpStoreServer::Impl::list(const WaiterPtr& w, const std::string& key) {
  w->watching = key;
  waiters_[key].push_back(w);
}

void TcpStoreServer::Impl::unlist(const WaiterPtr& w) {
  auto it = waiters_.find(w->watching);
  if (it == waiters_.end()) return;
  std::erase(it->second, w);
  if (it->second.empty()) waiters_.erase(it);
}

Response TcpStoreServer::Impl::timeout_response(std::uint64_t id,
                                                const std::vector<std::string>& missing) {
  Response r = make_store_response(id, Response::STATUS_TIMEOUT, "timed out");
  for (const auto& k : missing) r.add_missing_keys(k);
  return r;
}

TcpStoreServer::TcpStoreServer(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
TcpStoreServer::~TcpStoreServer() = default;
std::uint16_t TcpStoreServer::port() const { return impl_->port(); }
std::string TcpStoreServer::address() const { return impl_->address(); }
void TcpStoreServer::stop() { impl_->stop(); }
void TcpStoreServer::close_connections() { impl_->close_connections(); }
std::size_t TcpStoreServer::connection_count() const { return impl_->connection_count(); }
std::size_t TcpStoreServer::waiter_count() const { return impl_->waiter_count(); }

bool tcp_port_in_use(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw_errno("socket", "");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // unchecked: a socket (core/syscall.h)
  } closer{fd};
  // Without it, a port left in TIME_WAIT would read as in use.
  const int one = 1;
  DTRAIN_SYSCALL(::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), fmt::format("port {}", port));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  return ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno == EADDRINUSE;
}

}  // namespace dtrain::comm
