// The store of a job started by srun without a launcher: its address from
// the step's node list and the job/step ids, the run token handed over in a
// 0600 file, and a node's address from `scontrol show node` output.
#include <sys/stat.h>

#include <set>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cluster/environment.h"
#include "cluster/node_address.h"
#include "cluster/run_token.h"
#include "cluster/slurm_store.h"
#include "core/error.h"
#include "support/temp_dir.h"

namespace dtrain::cluster {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// What srun -N2 -n4 gives task 2 (node 1, local 0).
EnvMap srun_task2() {
  return {{"SLURM_PROCID", "2"},          {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "1"},          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_JOB_ID", "77"},         {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_NODELIST", "gpu-a[07-08]-ib"}, {"SLURMD_NODENAME", "gpu-a08-ib"}};
}

std::string error_of(const EnvMap& vars) {
  try {
    detect_environment(vars);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(SlurmStore, PortStaysInItsRangeAndSeparatesJobsAndSteps) {
  std::set<int> ports;
  for (int job = 1000; job < 2000; ++job) {
    for (int step = 0; step < kSlurmStepsPerJob; ++step) {
      const int port = slurm_store_port(std::to_string(job), std::to_string(step));
      ASSERT_GE(port, kSlurmStorePortBase);
      ASSERT_LT(port, kSlurmStorePortBase + kSlurmStorePortSpan);
      ports.insert(port);
    }
  }
  EXPECT_EQ(ports.size(), 1000u * kSlurmStepsPerJob) << "1000 consecutive jobs x 8 steps never share a port";
  EXPECT_EQ(slurm_store_port("0", "0"), kSlurmStorePortBase);
  EXPECT_EQ(slurm_store_port("12345", "1"), kSlurmStorePortBase + (12345 * 8 + 1) % 8000);
  // Huge job ids (federations use the upper bits) stay in range.
  const int big = slurm_store_port("67108864123", "0");
  EXPECT_GE(big, kSlurmStorePortBase);
  EXPECT_LT(big, kSlurmStorePortBase + kSlurmStorePortSpan);
}

TEST(SlurmStore, MalformedIdsNameTheVariableAndTheWayOut) {
  EXPECT_THROW(slurm_store_port("", "0"), Error);
  try {
    slurm_store_port("123", "batch");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("SLURM_STEP_ID='batch'"), HasSubstr("DTRAIN_STORE_PORT")));
  }
}

TEST(SlurmStore, EnvironmentPutsTheStoreOnTheStepsFirstNode) {
  const Environment env = detect_environment(srun_task2());
  EXPECT_EQ(env.store, "gpu-a07-ib:" + std::to_string(slurm_store_port("77", "3")));
  EXPECT_TRUE(env.store_from_slurm);
  EXPECT_EQ(env.slurmd_nodename, "gpu-a08-ib");
  EXPECT_EQ(env.slurm_restart_count, "");
}

TEST(SlurmStore, StorePortVariableWinsOverTheDerivedPort) {
  EnvMap vars = srun_task2();
  vars["DTRAIN_STORE_PORT"] = "31000";
  EXPECT_EQ(detect_environment(vars).store, "gpu-a07-ib:31000");
  vars["DTRAIN_STORE_PORT"] = "70000";
  EXPECT_THAT(error_of(vars), HasSubstr("DTRAIN_STORE_PORT=70000 must be a port"));
  vars["DTRAIN_STORE_PORT"] = "x";
  EXPECT_THAT(error_of(vars), HasSubstr("DTRAIN_STORE_PORT='x' is not an integer"));
}

TEST(SlurmStore, UserStoreWinsAndOneTaskNeedsNone) {
  EnvMap vars = srun_task2();
  vars["DTRAIN_STORE"] = "head:29500";
  vars["DTRAIN_STORE_PORT"] = "31000";
  Environment env = detect_environment(vars);
  EXPECT_EQ(env.store, "head:29500");
  EXPECT_FALSE(env.store_from_slurm);
  EnvMap one = {{"SLURM_PROCID", "0"},   {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_LOCALID", "0"},
                {"SLURM_NODEID", "0"},   {"SLURM_STEP_TASKS_PER_NODE", "1"}, {"SLURM_JOB_ID", "5"},
                {"SLURM_STEP_ID", "0"},  {"SLURM_STEP_NODELIST", "n1"}};
  env = detect_environment(one);
  EXPECT_FALSE(env.store.has_value());
}

TEST(SlurmStore, MalformedNodeListNamesTheVariable) {
  EnvMap vars = srun_task2();
  vars["SLURM_STEP_NODELIST"] = "n[1-";
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("SLURM_STEP_NODELIST"), HasSubstr("never closed")));
}

TEST(SlurmStore, RestartCountAndGpuVariablesAreKept) {
  EnvMap vars = srun_task2();
  vars["SLURM_RESTART_COUNT"] = "2";
  vars["CUDA_VISIBLE_DEVICES"] = "1";
  vars["SLURM_STEP_GPUS"] = "4,5";
  vars["SLURM_JOB_GPUS"] = "4,5,6,7";
  const Environment env = detect_environment(vars);
  EXPECT_EQ(env.slurm_restart_count, "2");
  EXPECT_EQ(env.cuda_visible_devices, "1");
  EXPECT_EQ(env.slurm_gpus, "4,5");
}

TEST(SlurmStore, TokenFileNameSeparatesStepsAndRequeues) {
  EXPECT_EQ(slurm_token_file("/out", "77", "3", ""), "/out/.store-token-77.3");
  EXPECT_EQ(slurm_token_file("/out", "77", "3", "0"), "/out/.store-token-77.3");
  EXPECT_EQ(slurm_token_file("/out", "77", "3", "1"), "/out/.store-token-77.3.r1");
}

TEST(RunToken, RandomTokensAreLongAndDiffer) {
  const std::string a = random_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, random_token());
}

TEST(RunToken, WrittenPrivatelyReadBackAndRemovedByItsOwner) {
  testing::TempDir dir;
  const auto path = dir / "out" / ".store-token-1.0";  // out/ does not exist yet
  {
    write_token_file(path, "s3cret");
    OwnedTokenFile owned(path);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(read_token_file(path, 1s), "s3cret");
    write_token_file(path, "again");  // replaced whole
    EXPECT_EQ(read_token_file(path, 1s), "again");
    OwnedTokenFile moved = std::move(owned);
    EXPECT_TRUE(owned.path().empty());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(RunToken, ReaderWaitsForTheFile) {
  testing::TempDir dir;
  const auto path = dir / ".store-token-1.0";
  std::thread writer([&] {
    std::this_thread::sleep_for(200ms);
    write_token_file(path, "late");
  });
  EXPECT_EQ(read_token_file(path, 20s), "late");
  writer.join();
}

TEST(RunToken, MissingFileTimesOutNamingTheFile) {
  testing::TempDir dir;
  const auto path = dir / ".store-token-9.0";
  try {
    read_token_file(path, 100ms);
    FAIL() << "no error";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(path.string()), HasSubstr("rank 0"), HasSubstr("every node sees"),
                                HasSubstr("DTRAIN_TOKEN")));
  }
  testing::TempDir other;
  other.write(".store-token-9.0", "\n");
  EXPECT_THROW(read_token_file(other / ".store-token-9.0", 1s), IoError);
}

TEST(NodeAddress, ParsesNodeAddrFromScontrol) {
  EXPECT_EQ(parse_node_addr("NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=vm Port=1"),
            "127.0.0.1");
  EXPECT_EQ(parse_node_addr("NodeName=n1\n   NodeAddr=10.1.0.7 NodeHostName=n1\n"), "10.1.0.7");
  EXPECT_EQ(parse_node_addr("XNodeAddr=1 NodeAddr=ib-n1"), "ib-n1");
  EXPECT_EQ(parse_node_addr("Node n9 not found"), std::nullopt);
  EXPECT_EQ(parse_node_addr("NodeAddr= NodeHostName=x"), std::nullopt);
}

TEST(NodeAddress, ResolvableNamesAreKept) {
  EXPECT_EQ(node_address("127.0.0.1", 1s), "127.0.0.1");
  EXPECT_EQ(node_address("localhost", 1s), "localhost");
}

}  // namespace
}  // namespace dtrain::cluster
