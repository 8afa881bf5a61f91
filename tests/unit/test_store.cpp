// The Store contract (comm/store.h), run against MemoryStore and TcpStore
// alike, then what only the TCP store has: tokens, hundreds of clients,
// malformed input, vanished clients and reconnection. Everything listens on
// and connects to 127.0.0.1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <latch>
#include <numeric>
#include <random>

#include "comm/memory_store.h"
#include "comm/store.h"
#include "comm/tcp_store.h"
#include "comm/tcp_store_server.h"
#include "core/error.h"
#include "support/store_contract.h"
#include "support/store_testing.h"

namespace dtrain::testing {
namespace {

// Each backend hands out clients of one store: every MemoryStore client is
// the same object; every TcpStore client is its own connection to one server.
struct MemoryBackend {
  static constexpr int kConcurrentClients = 64;
  static constexpr int kAddsEach = 100;
  std::shared_ptr<comm::MemoryStore> store = std::make_shared<comm::MemoryStore>();
  std::shared_ptr<Store> client() { return store; }
};

struct TcpBackend {
  static constexpr int kConcurrentClients = 64;
  static constexpr int kAddsEach = 100;
  LogCapture log;
  comm::TcpStoreServer server{store_server_options(log)};
  std::shared_ptr<Store> client() { return std::make_shared<comm::TcpStore>(store_client_options(server.port())); }
};

struct BackendNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, MemoryBackend> ? "Memory" : "Tcp";
  }
};

using Backends = ::testing::Types<MemoryBackend, TcpBackend>;
INSTANTIATE_TYPED_TEST_SUITE_P(Local, StoreContract, Backends, BackendNames);

}  // namespace
}  // namespace dtrain::testing

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using dtrain::testing::eventually;
using dtrain::testing::kStoreToken;
using dtrain::testing::LogCapture;
using dtrain::testing::RawConnection;
using dtrain::testing::run_threads;
using dtrain::testing::store_client_options;
using dtrain::testing::store_frame;
using dtrain::testing::store_hello_frame;
using dtrain::testing::store_length_prefix;
using dtrain::testing::store_server_options;

class TcpStoreTest : public ::testing::Test {
 protected:
  std::uint16_t port() const { return server_->port(); }
  std::unique_ptr<TcpStore> connect() { return std::make_unique<TcpStore>(store_client_options(port())); }

  LogCapture log_;  // outlives the server that writes to it
  std::unique_ptr<TcpStoreServer> server_ = std::make_unique<TcpStoreServer>(store_server_options(log_));
};

TEST_F(TcpStoreTest, WrongTokenIsRefusedWithAClearErrorAndLogged) {
  try {
    TcpStore intruder(store_client_options(port(), "wrong-token"));
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}", port())));
    EXPECT_THAT(e.what(), HasSubstr("token (DTRAIN_TOKEN) does not match"));
  }
  EXPECT_TRUE(eventually([&] { return log_.contains("refused 127.0.0.1:"); })) << log_.all();
  EXPECT_FALSE(log_.contains("wrong-token"));
  EXPECT_FALSE(log_.contains(kStoreToken));
  EXPECT_EQ(connect()->add("still-serving", 1), 1);
}

TEST_F(TcpStoreTest, ServerRequiresAToken) {
  auto options = store_server_options(log_);
  options.token.clear();
  EXPECT_THROW(TcpStoreServer{options}, CommError);
}

TEST_F(TcpStoreTest, ServerBindsAHostName) {
  auto options = store_server_options(log_);
  options.host = "localhost";  // binds its IPv4 address, 127.0.0.1
  TcpStoreServer by_name(options);
  EXPECT_EQ(TcpStore(store_client_options(by_name.port())).add("n", 2), 2);
}

TEST_F(TcpStoreTest, ServesTwoHundredFiftySixConnectedClientsAtOnce) {
  constexpr int kClients = 256;
  std::latch all_connected(kClients + 1);
  std::latch counted(1);
  std::atomic<int> answered{0};
  std::thread census([&] {
    all_connected.arrive_and_wait();
    EXPECT_EQ(server_->connection_count(), static_cast<std::size_t>(kClients));
    counted.count_down();
  });
  auto errors = run_threads(kClients, [&](int i) {
    std::unique_ptr<TcpStore> c;
    try {
      c = connect();
    } catch (...) {
      all_connected.count_down();  // never strand the others at the latch
      throw;
    }
    all_connected.arrive_and_wait();
    const std::string key = fmt::format("client/{}", i);
    c->set(key, to_bytes(std::to_string(i * 7)));
    if (to_string(c->get(key, 1s)) == std::to_string(i * 7)) ++answered;
    counted.wait();
  });
  census.join();
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_EQ(answered.load(), kClients);
  EXPECT_EQ(connect()->num_keys(), kClients);
}

// Feeds the server what a port scanner, a garbled stream or a client of
// another version might send; each bad connection must close alone.
TEST_F(TcpStoreTest, SurvivesMalformedFramesAndStillServes) {
  std::mt19937 rng(20240611);
  auto random_bytes = [&](std::size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xff);
    return s;
  };
  for (int i = 0; i < 10; ++i) RawConnection(port()).send(random_bytes(1 + rng() % 200));
  for (int i = 0; i < 10; ++i) RawConnection(port()).send(store_frame(random_bytes(rng() % 1000)));
  for (int i = 0; i < 10; ++i) RawConnection(port()).send(store_length_prefix(500) + random_bytes(rng() % 500));
  RawConnection(port()).send(store_length_prefix(0xffffffffu));
  for (int i = 0; i < 10; ++i) {  // authenticated, so garbage that happens to parse is served
    RawConnection fuzzed(port());
    fuzzed.send(store_hello_frame(kStoreToken));
    for (int j = 0; j < 3; ++j) fuzzed.send(store_frame(random_bytes(rng() % 2000)));
  }
  {
    RawConnection authenticated(port());
    authenticated.send(store_hello_frame(kStoreToken));
    ASSERT_TRUE(authenticated.read_response().has_value());
    authenticated.send(store_length_prefix(kStoreMaxFrameBytes + 1));
    EXPECT_TRUE(eventually([&] { return authenticated.closed_by_server(); }));
  }
  {
    RawConnection garbage_after_hello(port());
    garbage_after_hello.send(store_hello_frame(kStoreToken));
    ASSERT_TRUE(garbage_after_hello.read_response().has_value());
    garbage_after_hello.send(store_frame("\xff\xff\xff\xff garbage"));
    auto answer = garbage_after_hello.read_response();
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->status(), store::Response::STATUS_ERROR);
  }
  {
    RawConnection other_version(port());
    other_version.send(store_hello_frame(kStoreToken, kStoreVersion + 100));
    auto answer = other_version.read_response();
    ASSERT_TRUE(answer.has_value());
    EXPECT_THAT(answer->message(), HasSubstr("protocol mismatch"));
  }
  EXPECT_TRUE(eventually([&] { return server_->connection_count() == 0; })) << log_.all();
  EXPECT_TRUE(log_.contains("above the limit")) << log_.all();
  EXPECT_TRUE(log_.contains("in the middle of a frame")) << log_.all();
  auto c = connect();
  c->set("fine", to_bytes("yes"));
  EXPECT_EQ(to_string(c->get("fine", 1s)), "yes");
}

TEST_F(TcpStoreTest, ClientsThatVanishAreDroppedWithTheirWaiters) {
  RawConnection(port()).close();
  EXPECT_TRUE(eventually([&] { return log_.contains("before sending a hello"); })) << log_.all();

  RawConnection waiting(port());
  waiting.send(store_hello_frame(kStoreToken));
  ASSERT_TRUE(waiting.read_response().has_value());
  store::Request get;
  get.set_id(2);
  get.mutable_get()->set_key("vanish-key");
  get.mutable_get()->set_timeout_ms(10'000);
  waiting.send(store_frame(get.SerializeAsString()));
  ASSERT_TRUE(eventually([&] { return server_->waiter_count() == 1; }));
  waiting.close();
  EXPECT_TRUE(eventually([&] { return server_->waiter_count() == 0 && server_->connection_count() == 0; }));
  EXPECT_TRUE(log_.contains("vanished while a get of 'vanish-key' was waiting")) << log_.all();

  auto c = connect();  // setting the key the vanished client waited for harms nobody
  c->set("vanish-key", to_bytes("v"));
  EXPECT_EQ(to_string(c->get("vanish-key", 1s)), "v");
}

TEST_F(TcpStoreTest, ClientReconnectsOnceAfterTheServerDropsItsConnection) {
  auto c = connect();
  c->set("before", to_bytes("1"));
  server_->close_connections();
  EXPECT_EQ(to_string(c->get("before", 1s)), "1");
  EXPECT_EQ(c->add("after", 1), 1);
  EXPECT_TRUE(log_.contains("closing all 1 client connections"));
}

TEST_F(TcpStoreTest, WaitingGetSurvivesADroppedConnection) {
  auto reader = connect();
  std::thread get_thread([&] { EXPECT_EQ(to_string(reader->get("later", 1500ms)), "v"); });
  ASSERT_TRUE(eventually([&] { return server_->waiter_count() == 1; }));
  server_->close_connections();  // the get reconnects and asks again
  connect()->set("later", to_bytes("v"));
  get_thread.join();
}

TEST_F(TcpStoreTest, ClientReconnectsToAServerRestartedOnTheSamePort) {
  auto c = connect();
  c->set("old", to_bytes("1"));
  const std::uint16_t same_port = port();
  server_.reset();
  server_ = std::make_unique<TcpStoreServer>(store_server_options(log_, same_port));
  c->set("new", to_bytes("2"));
  EXPECT_EQ(to_string(c->get("new", 1s)), "2");
  EXPECT_FALSE(c->check("old"));  // a restarted server starts empty
}

TEST_F(TcpStoreTest, SecondFailureThrowsCommErrorNamingTheAddress) {
  auto options = store_client_options(port());
  options.connect_timeout = 200ms;
  options.timeout = 200ms;
  TcpStore c(options);
  const std::string address = fmt::format("127.0.0.1:{}", port());
  server_.reset();
  try {
    c.set("k", to_bytes("v"));
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr(address));
  }
}

TEST_F(TcpStoreTest, ConnectRetriesUntilTheServerStarts) {
  const std::uint16_t later_port = port();
  server_.reset();
  std::thread starter([&] {
    std::this_thread::sleep_for(100ms);
    server_ = std::make_unique<TcpStoreServer>(store_server_options(log_, later_port));
  });
  auto options = store_client_options(later_port);
  options.connect_timeout = 1500ms;
  TcpStore c(options);
  starter.join();
  c.set("k", to_bytes("v"));
  EXPECT_EQ(to_string(c.get("k", 1s)), "v");
}

TEST_F(TcpStoreTest, ConnectGivesUpWithCommErrorWhenNoServerAppears) {
  const std::uint16_t dead_port = port();
  server_.reset();
  auto options = store_client_options(dead_port);
  options.connect_timeout = 200ms;
  try {
    TcpStore c(options);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("cannot reach the store at 127.0.0.1:{}", dead_port)));
  }
}

}  // namespace
}  // namespace dtrain::comm
