// The gloo backend with N ranks as threads over an in-memory store: every
// collective, dtype and awkward count against closed-form results; async
// ordering; and the errors a rank that never arrives must produce.
#include <signal.h>

#include <atomic>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/connect.h"
#include "comm/memory_store.h"
#include "core/error.h"
#include "support/collective_checks.h"
#include "support/thread_ranks.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, EveryCollectiveMatchesClosedForm) {
  const int world = GetParam();
  std::atomic<std::size_t> wrong{0};
  std::mutex mu;
  std::vector<std::string> failures;
  testing::run_gloo_ranks(world, 60s, [&](comm::Communicator& comm) {
    for (const auto& c : testing::collective_cases(world, /*large=*/true)) {
      const std::size_t w = testing::run_collective_case(comm, c);
      if (w != 0) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(fmt::format("rank {}: {} wrong in {}", comm.rank(), w, c.describe()));
      }
      wrong += w;
    }
  });
  EXPECT_EQ(wrong.load(), 0u) << fmt::format("{}", fmt::join(failures, "\n"));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooWorld, ::testing::Values(1, 2, 3, 4));

TEST(CommGloo, HundredAsyncOperationsCompleteInOrder) {
  constexpr int kOps = 100;
  testing::run_gloo_ranks(3, 30s, [&](comm::Communicator& comm) {
    std::vector<std::vector<float>> buffers(kOps);
    std::vector<comm::Work> works;
    for (int k = 0; k < kOps; ++k) {
      buffers[k].assign(static_cast<std::size_t>(1 + k * 97), static_cast<float>(comm.rank() + k));
      works.push_back(k % 10 == 9 ? comm.barrier()
                                  : comm.allreduce(buffers[k].data(), buffers[k].size(), DType::f32,
                                                   comm::ReduceOp::sum));
    }
    // Waiting on the last first: when it is done, every earlier one must be.
    works.back().wait();
    for (int k = 0; k < kOps; ++k) {
      EXPECT_TRUE(works[k].completed()) << "operation " << k;
      EXPECT_EQ(works[k].seq(), static_cast<std::uint64_t>(k + 1));
    }
    for (int k = kOps - 1; k >= 0; --k) works[k].wait();
    for (int k = 0; k < kOps; ++k) {
      if (k % 10 == 9) continue;
      const float expected = static_cast<float>(0 + 1 + 2 + 3 * k);
      for (float v : buffers[k]) ASSERT_EQ(v, expected) << "operation " << k;
    }
    EXPECT_EQ(comm.last_seq(), static_cast<std::uint64_t>(kOps));
  });
}

TEST(CommGloo, MissingRankGivesTimeoutNamingOperationSequenceAndRank) {
  std::mutex mu;
  std::vector<std::string> errors;
  std::atomic<int> failed{0};
  testing::run_gloo_ranks(3, 1000ms, [&](comm::Communicator& comm) {
    std::vector<float> data(1000, 1.0f);
    comm.barrier().wait();  // #1: everyone is here
    if (comm.rank() == 2) {
      while (failed.load() < 2) std::this_thread::sleep_for(10ms);  // never joins #2
      return;
    }
    try {
      comm.allreduce(data.data(), data.size(), DType::f32, comm::ReduceOp::sum).wait();
      ADD_FAILURE() << "allreduce completed without rank 2";
    } catch (const TimeoutError& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
    // The communicator is broken now: later operations fail at once, naming the first error.
    try {
      comm.barrier().wait();
      ADD_FAILURE() << "a broken communicator ran an operation";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("barrier #3"));
      EXPECT_THAT(e.what(), HasSubstr("failed earlier"));
      EXPECT_THAT(e.what(), HasSubstr("allreduce #2"));
    }
    ++failed;
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_THAT(e, HasSubstr("allreduce #2 (f32 x 1000, sum)"));
    EXPECT_THAT(e, HasSubstr("timed out after 1000 ms"));
    EXPECT_THAT(e, HasSubstr("rank 2 did not reach #2"));
    EXPECT_THAT(e, HasSubstr("ranks 0-2"));  // the group involved
  }
}

TEST(CommGloo, WaitWithShortTimeoutReportsQueuedOperationWhichStillCompletes) {
  testing::run_gloo_ranks(2, 10s, [&](comm::Communicator& comm) {
    std::vector<float> data(100, 1.0f);
    if (comm.rank() == 1) std::this_thread::sleep_for(300ms);  // rank 0's op cannot finish yet
    comm::Work work = comm.allreduce(data.data(), data.size(), DType::f32, comm::ReduceOp::sum);
    if (comm.rank() == 0) {
      try {
        work.wait(20ms);
        ADD_FAILURE() << "completed before rank 1 arrived";
      } catch (const TimeoutError& e) {
        EXPECT_THAT(e.what(), HasSubstr("allreduce #1"));
        EXPECT_THAT(e.what(), HasSubstr("not complete after 20 ms"));
      }
    }
    work.wait();
    EXPECT_EQ(data[0], 2.0f);
  });
}

TEST(CommGloo, ReductionsRefuseIntegerBuffers) {
  testing::run_gloo_ranks(1, 5s, [&](comm::Communicator& comm) {
    std::vector<std::int32_t> data(4, 1);
    EXPECT_THROW(comm.allreduce(data.data(), data.size(), DType::i32, comm::ReduceOp::sum), CommError);
    // Moving integers is fine.
    comm.broadcast(data.data(), data.size(), DType::i32, 0).wait();
  });
}

// gloo writes with writev: with SIGPIPE at its default, a peer that died
// kills the survivor silently instead of failing its collective. Connecting
// ignores SIGPIPE, unless the program handles it itself.
void trivial_allreduce(comm::Communicator& comm) {
  float x = 1.0f;
  comm.allreduce(&x, 1, DType::f32, comm::ReduceOp::sum).wait();
}

sighandler_t sigpipe_disposition() {
  struct sigaction current {};
  ::sigaction(SIGPIPE, nullptr, &current);
  return current.sa_handler;
}

void counting_handler(int) {}

TEST(CommGloo, ConnectingIgnoresSigpipeSoADeadPeerIsAnErrorNotADeath) {
  ::signal(SIGPIPE, SIG_DFL);
  testing::run_gloo_ranks(2, 30s, trivial_allreduce);
  EXPECT_EQ(sigpipe_disposition(), SIG_IGN);

  ::signal(SIGPIPE, counting_handler);
  testing::run_gloo_ranks(2, 30s, trivial_allreduce);
  EXPECT_EQ(sigpipe_disposition(), &counting_handler) << "a program's own handler is kept";
  ::signal(SIGPIPE, SIG_DFL);
}

TEST(CommGloo, WhatGlooThrowsBecomesACommErrorNamingTheOperation) {
  // gloo cannot listen on an address of no interface here (192.0.2.1, RFC 5737 TEST-NET-1).
  EXPECT_THAT([] { comm::make_gloo_backend(0, 2, std::make_shared<comm::MemoryStore>(), 2s, "192.0.2.1"); },
              ::testing::ThrowsMessage<CommError>(::testing::StartsWith("gloo device on 192.0.2.1: ")));
}

}  // namespace
}  // namespace dtrain
