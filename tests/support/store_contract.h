// The contract every comm::Store implementation keeps (comm/store.h), as a
// typed test suite: a test file instantiates it with a backend type that
// hands out clients of one fresh store (`std::shared_ptr<Store> client()`)
// and says how many clients add to one counter at once
// (kConcurrentClients, kAddsEach); a static missing() may say what the
// machine lacks that the backend needs (the tests then fail, saying so):
//   INSTANTIATE_TYPED_TEST_SUITE_P(Name, StoreContract, ::testing::Types<MyBackend>);
// in namespace dtrain::testing.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/store.h"
#include "core/error.h"
#include "support/store_testing.h"

namespace dtrain::testing {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::PrefixStore;
using comm::Store;
using comm::to_bytes;
using comm::to_string;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

template <class Backend>
class StoreContract : public ::testing::Test {
 protected:
  // A backend that needs something the setup installs says what is missing in missing().
  void SetUp() override {
    if constexpr (requires { Backend::missing(); }) {
      if (const std::string why = Backend::missing(); !why.empty()) GTEST_FAIL() << why;
    }
  }
  std::shared_ptr<Store> client() { return backend_.client(); }
  Backend backend_;
};

TYPED_TEST_SUITE_P(StoreContract);

TYPED_TEST_P(StoreContract, SetThenGetReturnsTheValue) {
  auto s = this->client();
  s->set("a", to_bytes("1"));
  EXPECT_EQ(to_string(s->get("a", 1s)), "1");
  s->set("a", to_bytes("2"));
  EXPECT_EQ(to_string(s->get("a", 1s)), "2");
  const Bytes binary = {0, 255, 10, 0, 7};
  s->set("binary", binary);
  EXPECT_EQ(s->get("binary", 1s), binary);
  s->set("empty", {});
  EXPECT_THAT(s->get("empty", 1s), IsEmpty());
}

TYPED_TEST_P(StoreContract, GetWaitsForALaterSetFromAnotherThread) {
  auto reader = this->client();
  auto writer = this->client();
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    writer->set("late", to_bytes("here"));
  });
  EXPECT_EQ(to_string(reader->get("late", 1500ms)), "here");
  later.join();
}

TYPED_TEST_P(StoreContract, GetTimesOutWithTimeoutErrorNamingTheKey) {
  auto s = this->client();
  try {
    s->get("never-set", 100ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'never-set'"));
  }
  s->set("after", to_bytes("ok"));  // the store still serves this client
  EXPECT_EQ(to_string(s->get("after", 1s)), "ok");
}

TYPED_TEST_P(StoreContract, AddKeepsDecimalTextAndReturnsTheNewValue) {
  auto s = this->client();
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -7), -2);
  EXPECT_EQ(to_string(s->get("n", 1s)), "-2");
  s->set("m", to_bytes("40"));
  EXPECT_EQ(s->add("m", 2), 42);
  s->set("text", to_bytes("abc"));
  try {
    s->add("text", 1);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'text'"));
    EXPECT_THAT(e.what(), HasSubstr("not a decimal integer"));
  }
}

TYPED_TEST_P(StoreContract, CompareSetStoresOnlyWhenExpectedMatches) {
  auto s = this->client();
  EXPECT_EQ(to_string(s->compare_set("k", {}, to_bytes("a"))), "a");  // absent matches empty
  EXPECT_EQ(to_string(s->compare_set("k", to_bytes("zzz"), to_bytes("b"))), "a");
  EXPECT_EQ(to_string(s->get("k", 1s)), "a");
  EXPECT_EQ(to_string(s->compare_set("k", to_bytes("a"), to_bytes("b"))), "b");
  EXPECT_EQ(to_string(s->get("k", 1s)), "b");
  EXPECT_THAT(s->compare_set("absent", to_bytes("x"), to_bytes("y")), IsEmpty());
  EXPECT_FALSE(s->check("absent"));
}

TYPED_TEST_P(StoreContract, DeleteKeyReportsWhetherItExisted) {
  auto s = this->client();
  s->set("d", to_bytes("1"));
  EXPECT_TRUE(s->delete_key("d"));
  EXPECT_FALSE(s->check("d"));
  EXPECT_FALSE(s->delete_key("d"));
}

TYPED_TEST_P(StoreContract, WaitReturnsOnceEveryKeyExists) {
  auto waiter = this->client();
  auto writer = this->client();
  waiter->wait({}, 0ms);
  std::thread later([&] {
    writer->set("w1", to_bytes("1"));
    std::this_thread::sleep_for(30ms);
    writer->set("w2", to_bytes("2"));
  });
  waiter->wait({"w1", "w2"}, 1500ms);
  later.join();
  EXPECT_TRUE(waiter->check("w2"));
}

TYPED_TEST_P(StoreContract, WaitTimesOutNamingOnlyTheMissingKeys) {
  auto s = this->client();
  s->set("present", to_bytes("1"));
  try {
    s->wait({"present", "absent1", "absent2"}, 100ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing 'absent1', 'absent2'"));
  }
}

TYPED_TEST_P(StoreContract, CheckAndNumKeys) {
  auto s = this->client();
  EXPECT_EQ(s->num_keys(), 0);
  EXPECT_FALSE(s->check("x"));
  s->set("x", to_bytes("1"));
  s->add("y", 1);
  EXPECT_TRUE(s->check("x"));
  EXPECT_EQ(s->num_keys(), 2);
  s->delete_key("x");
  EXPECT_EQ(s->num_keys(), 1);
}

TYPED_TEST_P(StoreContract, PrefixStoreScopesKeys) {
  auto base = this->client();
  PrefixStore run1("run1", base);
  PrefixStore run2("run2", base);
  run1.set("k", to_bytes("1"));
  run2.set("k", to_bytes("2"));
  EXPECT_EQ(to_string(run1.get("k", 1s)), "1");
  EXPECT_EQ(to_string(run2.get("k", 1s)), "2");
  EXPECT_EQ(to_string(base->get("run1/k", 1s)), "1");
  EXPECT_EQ(run1.add("n", 3), 3);
  EXPECT_FALSE(run2.check("n"));
  EXPECT_EQ(to_string(run1.compare_set("k", to_bytes("1"), to_bytes("one"))), "one");
  run1.wait({"k", "n"}, 1s);
  EXPECT_TRUE(run1.delete_key("k"));
  EXPECT_TRUE(run2.check("k"));
  EXPECT_EQ(run1.num_keys(), 2);  // run1/n and run2/k: num_keys counts the whole store
  EXPECT_THROW(run1.get("missing", 50ms), TimeoutError);
}

TYPED_TEST_P(StoreContract, ClientsAddingConcurrentlyLoseNoUpdate) {
  constexpr int kClients = TypeParam::kConcurrentClients;
  constexpr int kAddsEach = TypeParam::kAddsEach;
  std::mutex mu;
  std::vector<std::int64_t> seen;
  auto errors = run_threads(kClients, [&](int) {
    auto s = this->client();
    std::vector<std::int64_t> mine;
    for (int i = 0; i < kAddsEach; ++i) mine.push_back(s->add("counter", 1));
    std::lock_guard lock(mu);
    seen.insert(seen.end(), mine.begin(), mine.end());
  });
  ASSERT_THAT(errors, IsEmpty());
  EXPECT_EQ(this->client()->add("counter", 0), kClients * kAddsEach);
  // Every add saw a distinct value: none was applied twice or lost.
  std::sort(seen.begin(), seen.end());
  std::vector<std::int64_t> expected(kClients * kAddsEach);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(seen, expected);
}

REGISTER_TYPED_TEST_SUITE_P(StoreContract,
                            SetThenGetReturnsTheValue,
                            GetWaitsForALaterSetFromAnotherThread,
                            GetTimesOutWithTimeoutErrorNamingTheKey,
                            AddKeepsDecimalTextAndReturnsTheNewValue,
                            CompareSetStoresOnlyWhenExpectedMatches,
                            DeleteKeyReportsWhetherItExisted,
                            WaitReturnsOnceEveryKeyExists,
                            WaitTimesOutNamingOnlyTheMissingKeys,
                            CheckAndNumKeys,
                            PrefixStoreScopesKeys,
                            ClientsAddingConcurrentlyLoseNoUpdate);

}  // namespace dtrain::testing
