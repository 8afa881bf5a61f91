#include "comm/etcd_store.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <random>
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/store_table.h"
#include "core/error.h"

namespace dtrain::comm {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const unsigned v = static_cast<unsigned char>(in[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8);
    for (int s : {18, 12, 6}) out += kAlphabet[(v >> s) & 63];
    out += "=";
  }
  return out;
}

std::string unbase64(const std::string& in) {
  std::string out;
  unsigned v = 0;
  int bits = 0;
  for (const char c : in) {
    if (c == '=') break;
    const char* at = std::strchr(kAlphabet, c);
    if (c == '\0' || at == nullptr) throw CommError("etcd answered a value that is not base64");
    v = (v << 6) | static_cast<unsigned>(at - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 0xff);
    }
  }
  return out;
}

std::string b64(const Bytes& b) { return base64(to_string(b)); }

// grpc-gateway writes int64 fields as JSON strings and leaves out zeros.
std::int64_t int64_of(const json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number()) return it->get<std::int64_t>();
  const std::string text = it->get<std::string>();
  std::int64_t v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}

// The key right after every key that starts with `prefix`: etcd's range_end for a prefix.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string where(const cluster::HostPort& e) {
  return e.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", e.host, e.port)
                                               : fmt::format("{}:{}", e.host, e.port);
}

// gRPC codes after which another member may do better: unavailable (no
// leader, a member shutting down), deadline exceeded, aborted.
bool try_elsewhere(int code) { return code == 14 || code == 4 || code == 10; }

// What an endpoint answered that no other endpoint would answer otherwise.
struct EtcdRefusal {
  std::string message;
};

}  // namespace

// One keep-alive HTTP/1.1 connection to one endpoint at a time; a request
// that fails on it moves to the next endpoint.
class EtcdStore::Http {
 public:
  Http(std::vector<cluster::HostPort> endpoints, Duration attempt_timeout)
      : endpoints_(std::move(endpoints)), attempt_timeout_(attempt_timeout) {}

  // POSTs `body` to `path` and returns the parsed answer. Throws CommError
  // when no endpoint answered by `deadline`, naming each and its last error;
  // EtcdRefusal when etcd refused the request itself.
  json post(const std::string& path, const std::string& body, Clock::time_point deadline) {
    std::vector<std::string> errors(endpoints_.size());
    for (int pass = 0;; ++pass) {
      for (std::size_t n = 0; n < endpoints_.size(); ++n) {
        const std::size_t e = (current_ + n) % endpoints_.size();
        const auto attempt_deadline = std::min(deadline, Clock::now() + attempt_timeout_);
        std::string error;
        if (auto answer = attempt(e, path, body, attempt_deadline, error)) {
          current_ = e;
          return *answer;
        }
        errors[e] = error;
        if (Clock::now() >= deadline) break;
      }
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(std::min(200, 20 << std::min(pass, 3))));
    }
    std::string said;
    bool silent = false;  // connected, but no answer
    for (std::size_t e = 0; e < endpoints_.size(); ++e) {
      if (errors[e].empty()) continue;
      said += fmt::format("{}{}: {}", said.empty() ? "" : "; ", where(endpoints_[e]), errors[e]);
      silent = silent || errors[e].rfind("no answer: nothing within", 0) == 0 || errors[e].rfind("etcd said", 0) == 0;
    }
    throw CommError(fmt::format("no etcd endpoint answered {} ({}); {}", path, said,
                                silent ? "a member that takes connections but does not answer has most likely lost "
                                         "its quorum (most of the cluster's members are down): bring them back"
                                       : "check that etcd runs there and that --rdzv-endpoint lists its client URLs"));
  }

 private:
  // One try on endpoint e; empty with `error` set when it failed.
  std::optional<json> attempt(std::size_t e, const std::string& path, const std::string& body,
                              Clock::time_point deadline, std::string& error) {
    if (stream_ && connected_to_ != e) close();
    const auto fail = [&](const std::string& what, const boost::system::error_code& ec) {
      error = ec == beast::error::timeout ? fmt::format("{}: nothing within {} ms", what, attempt_timeout_.count())
                                          : fmt::format("{}: {}", what, ec.message());
      close();
      return std::nullopt;
    };
    boost::system::error_code ec;
    if (!stream_) {
      tcp::resolver resolver(io_);
      const auto addresses = resolver.resolve(endpoints_[e].host, std::to_string(endpoints_[e].port), ec);
      if (ec) return fail("cannot resolve the host", ec);
      stream_.emplace(io_);
      stream_->expires_at(deadline);
      ec = run([&](auto done) { stream_->async_connect(addresses, [done](auto ec, auto) { done(ec); }); });
      if (ec) return fail("cannot connect", ec);
      connected_to_ = e;
    }
    http::request<http::string_body> request{http::verb::post, path, 11};
    request.set(http::field::host, where(endpoints_[e]));
    request.set(http::field::content_type, "application/json");
    request.keep_alive(true);
    request.body() = body;
    request.prepare_payload();
    stream_->expires_at(deadline);
    ec = run([&](auto done) { http::async_write(*stream_, request, [done](auto ec, auto) { done(ec); }); });
    if (ec) return fail("sending failed", ec);
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    buffer_.clear();
    stream_->expires_at(deadline);
    ec = run([&](auto done) { http::async_read(*stream_, buffer_, parser, [done](auto ec, auto) { done(ec); }); });
    if (ec) return fail("no answer", ec);  // "no answer: nothing within N ms" when it took the request and sat on it
    const auto& response = parser.get();
    if (!response.keep_alive()) close();
    json answer = json::parse(response.body(), nullptr, false);
    if (answer.is_discarded()) {
      error = fmt::format("answered HTTP {} with something that is not JSON: '{}'", response.result_int(),
                          response.body().substr(0, 120));
      close();
      return std::nullopt;
    }
    if (response.result() != http::status::ok || answer.contains("error")) {
      const int code = answer.value("code", 0);
      const std::string message = answer.value("message", answer.value("error", std::string("?")));
      if (try_elsewhere(code)) {
        error = fmt::format("etcd said: {}", message);
        close();
        return std::nullopt;
      }
      throw EtcdRefusal{fmt::format("{} said: {}", where(endpoints_[e]), message)};
    }
    return answer;
  }

  // Runs one asynchronous operation to its end; the stream's expiry bounds it.
  template <class Start>
  boost::system::error_code run(Start start) {
    boost::system::error_code result = asio::error::would_block;
    start([&result](boost::system::error_code ec) { result = ec; });
    io_.restart();
    io_.run();
    return result;
  }

  void close() {
    if (stream_) {
      boost::system::error_code ignored;
      stream_->socket().close(ignored);
      stream_.reset();
    }
  }

  std::vector<cluster::HostPort> endpoints_;
  Duration attempt_timeout_;
  asio::io_context io_;
  std::optional<beast::tcp_stream> stream_;
  std::size_t connected_to_ = 0;
  std::size_t current_ = 0;  // the endpoint that answered last
  beast::flat_buffer buffer_;
};

struct EtcdStore::Value {
  Bytes bytes;
  std::int64_t mod_revision = 0;
};

namespace {

std::optional<std::pair<Bytes, std::int64_t>> first_kv(const json& range) {
  const auto it = range.find("kvs");
  if (it == range.end() || it->empty()) return std::nullopt;
  const json& kv = it->front();
  return std::pair{to_bytes(unbase64(kv.value("value", std::string()))), int64_of(kv, "mod_revision")};
}

// A transaction: put `value` at `key` if `compare` holds, else read the key.
json put_if(const std::string& key, const json& compare, const std::string& value) {
  return json{{"compare", json::array({compare})},
              {"success", json::array({json{{"request_put", {{"key", base64(key)}, {"value", base64(value)}}}}})},
              {"failure", json::array({json{{"request_range", {{"key", base64(key)}}}}})}};
}

// The key's value and mod revision that a failed put_if read, if it exists.
std::optional<std::pair<Bytes, std::int64_t>> read_after_failure(const json& answer) {
  const json responses = answer.value("responses", json::array());
  if (responses.empty()) return std::nullopt;
  return first_kv(responses.front().value("response_range", json::object()));
}

// The comparison "key does not exist" (it was never created since its last delete).
json absent(const std::string& key) {
  return json{{"key", base64(key)}, {"result", "EQUAL"}, {"target", "CREATE"}, {"create_revision", "0"}};
}

}  // namespace

EtcdStore::EtcdStore(Options options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw CommError("etcd store: no endpoint given; list etcd's client endpoints");
  if (!options_.log) options_.log = [](const std::string& line) { fmt::print(stderr, "etcd store: {}\n", line); };
  http_ = std::make_unique<Http>(options_.endpoints, options_.attempt_timeout);
  const auto deadline = Clock::now() + options_.connect_timeout;
  const std::string list = cluster::host_port_list(options_.endpoints);
  try {
    // Any cheap read proves an endpoint answers and has a leader.
    http_->post("/v3/kv/range", json{{"key", base64(options_.prefix)}, {"count_only", true}}.dump(), deadline);
    if (options_.lease_ttl.count() > 0) grant_lease(*http_, deadline);
  } catch (const CommError& e) {
    throw CommError(fmt::format("cannot reach the etcd cluster at {} within {} ms: {}", list,
                                options_.connect_timeout.count(), e.what()));
  } catch (const EtcdRefusal& r) {
    throw CommError(fmt::format("the etcd cluster at {} refused this client: {}", list, r.message));
  }
  if (options_.lease_ttl.count() > 0) lease_thread_ = std::thread([this] { keep_alive(); });
}

EtcdStore::~EtcdStore() {
  if (lease_thread_.joinable()) {
    {
      std::lock_guard lock(lease_mu_);
      stopping_ = true;
    }
    lease_cv_.notify_all();
    lease_thread_.join();
    try {  // its keys go now rather than ttl later
      std::lock_guard lock(mu_);
      http_->post("/v3/lease/revoke", json{{"ID", std::to_string(lease_.load())}}.dump(),
                  Clock::now() + milliseconds(1000));
    } catch (...) {
      // the lease expires by itself
    }
  }
}

std::string EtcdStore::describe() const { return "etcd endpoints " + cluster::host_port_list(options_.endpoints); }

void EtcdStore::grant_lease(Http& http, Clock::time_point deadline) {
  const json answer = http.post("/v3/lease/grant", json{{"TTL", options_.lease_ttl.count()}}.dump(), deadline);
  lease_ = int64_of(answer, "ID");
}

// Keeps the lease alive every ttl/3 on a connection of its own; a lease that
// expired anyway (etcd unreachable for a whole ttl) is replaced, saying that
// the keys it carried are gone.
void EtcdStore::keep_alive() {
  Http http(options_.endpoints, options_.attempt_timeout);
  const auto period = std::chrono::duration_cast<milliseconds>(options_.lease_ttl) / 3;
  bool failing = false;
  for (;;) {
    {
      std::unique_lock lock(lease_mu_);
      if (lease_cv_.wait_for(lock, period, [this] { return stopping_; })) return;
    }
    try {
      const json answer = http.post("/v3/lease/keepalive", json{{"ID", std::to_string(lease_.load())}}.dump(),
                                    Clock::now() + period);
      const json& result = answer.contains("result") ? answer["result"] : answer;
      if (int64_of(result, "TTL") <= 0) {
        options_.log(fmt::format("lease {:x} expired (etcd was out of reach for {} s): the keys it carried are "
                                 "gone; granting a new one",
                                 lease_.load(), options_.lease_ttl.count()));
        grant_lease(http, Clock::now() + period);
      }
      if (failing) options_.log("the lease is kept alive again");
      failing = false;
    } catch (const CommError& e) {
      if (!failing) options_.log(fmt::format("cannot keep the lease alive: {}", e.what()));
      failing = true;
    } catch (const EtcdRefusal& r) {
      if (!failing) options_.log(fmt::format("cannot keep the lease alive: {}", r.message));
      failing = true;
    }
  }
}

json EtcdStore::post(const std::string& path, const std::string& body) {
  std::lock_guard lock(mu_);
  try {
    return http_->post(path, body, Clock::now() + options_.timeout);
  } catch (const EtcdRefusal& r) {
    throw CommError(fmt::format("etcd store ({}): {} refused: {}", describe(), path, r.message));
  }
}

std::optional<EtcdStore::Value> EtcdStore::range(const std::string& full_key) {
  const json answer = post("/v3/kv/range", json{{"key", base64(full_key)}}.dump());
  if (auto kv = first_kv(answer)) return Value{std::move(kv->first), kv->second};
  return std::nullopt;
}

void EtcdStore::set(const std::string& key, const Bytes& value) {
  json body{{"key", base64(options_.prefix + key)}, {"value", b64(value)}};
  if (const std::int64_t lease = lease_.load(); lease != 0) body["lease"] = std::to_string(lease);
  post("/v3/kv/put", body.dump());
}

Bytes EtcdStore::get(const std::string& key, Duration timeout) {
  const auto deadline = Clock::now() + clamp_store_wait(timeout);
  milliseconds pause(2);
  for (;;) {
    if (auto v = range(options_.prefix + key)) return std::move(v->bytes);
    if (Clock::now() >= deadline) {
      throw TimeoutError(fmt::format("etcd store ({}): get timed out after {} ms waiting for '{}' (is the "
                                     "process that sets it running?)",
                                     describe(), timeout.count(), key));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, milliseconds(50));
  }
}

std::int64_t EtcdStore::add(const std::string& key, std::int64_t delta) {
  const std::string full = options_.prefix + key;
  std::optional<Value> current = range(full);
  thread_local std::minstd_rand jitter(std::random_device{}());
  for (int attempt = 0;; ++attempt) {
    std::int64_t value = 0;
    if (current) {
      StoreTable one;
      one.set(key, current->bytes);
      value = one.add(key, 0);  // the same check (decimal text) and message as the other stores
    }
    if (current && delta == 0) return value;  // a read (the agents poll counters so): no write, no new revision
    std::int64_t next = 0;
    if (__builtin_add_overflow(value, delta, &next)) {
      throw CommError(fmt::format("store key '{}': adding {} to {} overflows int64", key, delta, value));
    }
    // Stored only if nobody wrote the key since we read it (or it is still absent).
    const json compare = current ? json{{"key", base64(full)}, {"result", "EQUAL"}, {"target", "MOD"},
                                        {"mod_revision", std::to_string(current->mod_revision)}}
                                 : absent(full);
    const json answer = post("/v3/kv/txn", put_if(full, compare, std::to_string(next)).dump());
    if (answer.value("succeeded", false)) return next;
    current.reset();
    if (auto kv = read_after_failure(answer)) current = Value{std::move(kv->first), kv->second};
    // Another client won the race: back off a little, at random, so that many do not collide again.
    if (attempt >= 2) std::this_thread::sleep_for(std::chrono::microseconds(jitter() % (200 * std::min(attempt, 20))));
  }
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string full = options_.prefix + key;
  const json value_matches{{"key", base64(full)}, {"result", "EQUAL"}, {"target", "VALUE"}, {"value", b64(expected)}};
  for (;;) {
    // etcd's value comparison fails on an absent key, which matches only an empty `expected`.
    const json answer = post("/v3/kv/txn", put_if(full, value_matches, to_string(desired)).dump());
    if (answer.value("succeeded", false)) return desired;
    const auto kv = read_after_failure(answer);
    if (kv || !expected.empty()) return kv ? kv->first : Bytes{};
    // Absent and `expected` empty: create it unless someone just did.
    const json created = post("/v3/kv/txn", put_if(full, absent(full), to_string(desired)).dump());
    if (created.value("succeeded", false)) return desired;
    const auto now = read_after_failure(created);
    if (now && now->first != expected) return now->first;
    // It was created with the empty value meanwhile (or deleted again): compare anew.
  }
}

bool EtcdStore::delete_key(const std::string& key) {
  const json answer = post("/v3/kv/deleterange", json{{"key", base64(options_.prefix + key)}}.dump());
  return int64_of(answer, "deleted") > 0;
}

void EtcdStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const auto deadline = Clock::now() + clamp_store_wait(timeout);
  milliseconds pause(2);
  std::vector<std::string> missing = keys;
  for (;;) {
    std::vector<std::string> still;
    for (const auto& k : missing) {
      if (!check(k)) still.push_back(k);
    }
    missing = std::move(still);
    if (missing.empty()) return;
    if (Clock::now() >= deadline) {
      throw TimeoutError(fmt::format("etcd store ({}): wait timed out after {} ms; still missing {} (are the "
                                     "processes that set them running?)",
                                     describe(), timeout.count(), quote_keys(missing)));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, milliseconds(50));
  }
}

bool EtcdStore::check(const std::string& key) {
  const json answer =
      post("/v3/kv/range", json{{"key", base64(options_.prefix + key)}, {"count_only", true}}.dump());
  return int64_of(answer, "count") > 0;
}

std::int64_t EtcdStore::num_keys() {
  const json answer = post("/v3/kv/range", json{{"key", base64(options_.prefix)},
                                                            {"range_end", base64(prefix_end(options_.prefix))},
                                                            {"count_only", true}}
                                                           .dump());
  return int64_of(answer, "count");
}

std::int64_t EtcdStore::delete_prefix(const std::string& prefix) {
  const std::string full = options_.prefix + prefix;
  const json answer =
      post("/v3/kv/deleterange", json{{"key", base64(full)}, {"range_end", base64(prefix_end(full))}}.dump());
  return int64_of(answer, "deleted");
}

std::shared_ptr<EtcdStore> etcd_store_client(const std::string& address, Duration connect_timeout, Duration timeout) {
  EtcdStore::Options options;
  options.endpoints = cluster::parse_etcd_endpoints(address, "DTRAIN_STORE");
  options.connect_timeout = connect_timeout;
  options.timeout = timeout;
  return std::make_shared<EtcdStore>(options);
}

}  // namespace dtrain::comm
