// Collectives across real processes (gloo over TCP, ranks started with the
// launcher's environment variables by hand, rank 0 hosting the store):
// conformance, a rank that never arrives, and a rank killed with SIGKILL in
// the middle of collectives. Each must end in a clear error, never a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain {
namespace {

using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::vector<testing::Spawned> start_ranks(const testing::TempDir& dir, int world,
                                          const std::vector<std::string>& args) {
  const std::string store = "127.0.0.1:" + std::to_string(testing::free_port());
  std::vector<testing::Spawned> procs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {testing::program_dir() + "/comm_conformance"};
    argv.insert(argv.end(), args.begin(), args.end());
    procs.push_back(testing::spawn_process(
        argv,
        {{"DTRAIN_RANK", std::to_string(r)}, {"DTRAIN_WORLD_SIZE", std::to_string(world)},
         {"DTRAIN_STORE", store}, {"DTRAIN_TOKEN", "test-token"}, {"DTRAIN_RUN_ID", "t"}},
        dir.file("rank_" + std::to_string(r) + ".log")));
  }
  return procs;
}

TEST(CommProcesses, GlooConformanceAcrossThreeProcesses) {
  testing::TempDir dir;
  auto procs = start_ranks(dir, 3, {"--backend", "gloo"});
  ASSERT_TRUE(testing::wait_all(procs, 120s)) << "a rank hung";
  for (auto& p : procs) EXPECT_EQ(p.exit_code(), 0) << p.log();
  EXPECT_THAT(procs[0].log(), HasSubstr("wrong_total: 0"));
}

TEST(CommProcesses, RankThatNeverArrivesIsNamedByTheOthers) {
  testing::TempDir dir;
  auto procs = start_ranks(dir, 3, {"--backend", "gloo", "--timeout-ms", "1500", "--hang-rank", "1"});
  // The survivors fail within the timeout plus the diagnosis; rank 1 sleeps
  // on and is killed by wait_all.
  testing::wait_all(procs, 20s);
  for (int r : {0, 2}) {
    const std::string log = procs[static_cast<std::size_t>(r)].log();
    EXPECT_EQ(procs[static_cast<std::size_t>(r)].exit_code(), 2) << log;
    EXPECT_THAT(log, HasSubstr("TimeoutError"));
    EXPECT_THAT(log, HasSubstr("allreduce #1 (f32 x 1024, sum)"));
    EXPECT_THAT(log, HasSubstr("rank 1 did not reach #1"));
  }
}

TEST(CommProcesses, RankKilledMidCollectiveGivesErrorsNotHang) {
  testing::TempDir dir;
  auto procs = start_ranks(dir, 3,
                           {"--backend", "gloo", "--timeout-ms", "3000", "--die-rank", "2", "--die-after-ms", "700"});
  ASSERT_TRUE(testing::wait_all(procs, 60s)) << "a survivor hung: " << procs[0].log() << procs[1].log();
  EXPECT_TRUE(procs[2].killed_by(SIGKILL));
  for (int r : {0, 1}) {
    const std::string log = procs[static_cast<std::size_t>(r)].log();
    EXPECT_EQ(procs[static_cast<std::size_t>(r)].exit_code(), 2)
        << "rank " << r << ": " << procs[static_cast<std::size_t>(r)].outcome() << "\n" << log;
    EXPECT_THAT(log, AnyOf(HasSubstr("CommError"), HasSubstr("TimeoutError")));
    EXPECT_THAT(log, HasSubstr("allreduce #"));
    // Rank 2 (the highest) ends the list of ranks that reported nothing; a
    // survivor slow to fail may be listed with it.
    EXPECT_THAT(log, ContainsRegex("ranks? [0-9, -]*2 did not reach #[0-9]+ and reported nothing"));
  }
}

TEST(CommProcesses, StoppedRankIsNamedBySurvivorsWhoTimeOut) {
  testing::TempDir dir;
  auto procs = start_ranks(dir, 3, {"--backend", "gloo", "--timeout-ms", "2000", "--loop"});
  std::this_thread::sleep_for(1500ms);  // well into the loop of collectives
  ::kill(procs[1].pid, SIGSTOP);
  std::vector<testing::Spawned> survivors = {procs[0], procs[2]};
  const bool finished = testing::wait_all(survivors, 30s);
  ::kill(procs[1].pid, SIGKILL);
  std::vector<testing::Spawned> stopped = {procs[1]};
  testing::wait_all(stopped, 10s);
  ASSERT_TRUE(finished) << "a survivor hung";
  for (const auto& p : survivors) {
    const std::string log = p.log();
    EXPECT_EQ(p.exit_code(), 2) << log;
    EXPECT_THAT(log, HasSubstr("TimeoutError"));
    EXPECT_THAT(log, ContainsRegex("rank 1 did not reach #[0-9]+ and reported nothing"));
  }
}

}  // namespace
}  // namespace dtrain
