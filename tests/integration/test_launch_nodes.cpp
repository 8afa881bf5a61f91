// dtrain-launch agents as nodes: two agents on loopback form one job and
// train what the job started by hand trains; two agents in two network
// namespaces (198.51.100.0/24, talking only inside the namespaces) do the
// same; an elastic job (--nnodes 1:2) whose second agent is killed goes on
// with one node and finishes from its checkpoint; without --rdzv-id both
// nodes' workers get the one fresh run id the store's host made.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "integration/launch_testing.h"
#include "integration/netns_testing.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> node_args(int nnodes_min, int nnodes_max, int rank, const std::string& endpoint,
                                   const TempDir& dir) {
  const std::string nnodes =
      nnodes_min == nnodes_max ? std::to_string(nnodes_min) : fmt::format("{}:{}", nnodes_min, nnodes_max);
  return {"--nnodes", nnodes, "--node-rank", std::to_string(rank), "--rdzv-endpoint", endpoint, "--rdzv-id", "nodes",
          "--nproc-per-node", "1", "--rdzv-timeout", "60", "--log-dir", dir.file(fmt::format("logs{}", rank))};
}

const std::map<std::string, std::string> kToken = {{"DTRAIN_TOKEN", "shared-node-secret"}};

TEST(LaunchNodes, TwoAgentsOnLoopbackFormOneJob) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  ASSERT_TRUE(run_by_hand(dir, 2, worker_command(config, dir / "hand"))) << read_file(dir / "hand0.log");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(start_launch(node_args(2, 2, node, endpoint, dir), worker_command(config, dir / "run"),
                                  dir.file(fmt::format("agent{}.log", node)), kToken));
  }
  ASSERT_TRUE(wait_all(agents, 120s)) << read_file(dir / "agent0.log") << read_file(dir / "agent1.log");
  for (auto& a : agents) ASSERT_EQ(a.exit_code(), 0) << a.log();
  EXPECT_THAT(agents[1].log(), HasSubstr("round 0: node 1 of 2, ranks 1-1 of 2"));
  EXPECT_THAT(agents[0].log(), HasSubstr("[rank 0] dtrain-worker: lm model, 20 steps"));
  EXPECT_EQ(comparable_metrics(dir / "run" / "metrics.jsonl"), comparable_metrics(dir / "hand" / "metrics.jsonl"));
}

TEST(LaunchNodes, TwoAgentsInTwoNetworkNamespacesFormOneJob) {
  Namespaces ns;
  const std::string why = ns.make();
  ASSERT_TRUE(why.empty()) << "cannot make two network namespaces (needs root and iproute2, which "
                              "scripts/setup.sh installs): " << why;
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::string endpoint = "198.51.100.1:29517";
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = {"/usr/sbin/ip", "netns", "exec", node == 0 ? ns.a() : ns.b(), launcher()};
    const auto args = node_args(2, 2, node, endpoint, dir);
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--");
    const auto command = worker_command(config, dir / "run");
    argv.insert(argv.end(), command.begin(), command.end());
    if (!std::filesystem::exists(argv[0])) argv[0] = "/sbin/ip";
    agents.push_back(spawn_process(argv, kToken, dir.file(fmt::format("agent{}.log", node))));
  }
  ASSERT_TRUE(wait_all(agents, 120s)) << read_file(dir / "agent0.log") << read_file(dir / "agent1.log");
  for (auto& a : agents) ASSERT_EQ(a.exit_code(), 0) << a.log();
  EXPECT_THAT(agents[0].log(), HasSubstr("hosting the run's store on 198.51.100.1:29517"));
  EXPECT_THAT(agents[0].log(), HasSubstr("[rank 0] done: 20 steps"));
  EXPECT_THAT(agents[1].log(), HasSubstr("round 0: node 1 of 2, ranks 1-1 of 2"));
}

TEST(LaunchNodes, ElasticJobLosingANodeGoesOnWithTheOther) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const auto command = worker_command(config, dir / "run", {"train.steps=300", "train.grad_accum_steps=2",
                                                            "checkpoint.every_steps=10", "checkpoint.resume=auto"});
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    auto args = node_args(1, 2, node, endpoint, dir);
    args.insert(args.end(), {"--rdzv-last-call", "5", "--max-restarts", "2", "--stop-timeout", "5"});
    agents.push_back(start_launch(args, command, dir.file(fmt::format("agent{}.log", node)), kToken));
  }
  const std::string log0 = dir.file("agent0.log");
  ASSERT_FALSE(wait_for_text(log0, "round 0: node 0 of 2", 60s).empty()) << read_file(log0);
  ASSERT_FALSE(wait_for_text(log0, "step +30/300", 60s).empty()) << read_file(log0);
  ::kill(agents[1].pid, SIGKILL);
  ASSERT_TRUE(wait_all(agents, 120s)) << read_file(log0);
  const std::string out = read_file(log0);
  EXPECT_EQ(agents[0].exit_code(), 0) << out;
  EXPECT_THAT(out, HasSubstr("round 1: node 0 of 1, ranks 0-0 of 1"));
  EXPECT_THAT(out, ::testing::ContainsRegex("resumed from .* saved by 2 rank"));
  EXPECT_THAT(out, ::testing::ContainsRegex("\\[rank 0\\] done: [0-9]+ steps \\(steps [0-9]+-300, resumed after step"));
}

TEST(LaunchNodes, WithoutRdzvIdEveryNodeTakesTheRunIdTheStoresHostMade) {
  TempDir dir;
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(start_launch({"--nnodes", "2", "--node-rank", std::to_string(node), "--rdzv-endpoint", endpoint,
                                   "--rdzv-timeout", "60", "--log-dir", dir.file(fmt::format("logs{}", node))},
                                  {"/bin/sh", "-c", "echo \"run=$TORCHELASTIC_RUN_ID\""},
                                  dir.file(fmt::format("agent{}.log", node)), kToken));
  }
  ASSERT_TRUE(wait_all(agents, 120s)) << read_file(dir / "agent0.log") << read_file(dir / "agent1.log");
  for (auto& a : agents) ASSERT_EQ(a.exit_code(), 0) << a.log();
  const auto made = wait_for_text(dir.file("agent0.log"), "run id ([0-9a-f]{12}) \\(fresh for this job", 1s);
  ASSERT_EQ(made.size(), 2u) << agents[0].log();
  EXPECT_THAT(agents[0].log(), HasSubstr("[rank 0] run=" + made[1]));
  EXPECT_THAT(agents[1].log(), HasSubstr("[rank 1] run=" + made[1]));
  EXPECT_THAT(agents[1].log(), HasSubstr("run id " + made[1] + " (fresh for this job"));
  // An agent given another --rdzv-id than the host's stops at once, saying so.
  std::vector<Spawned> host{start_launch({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint,
                                          "--rdzv-id", "a", "--log-dir", dir.file("logs0")},
                                         {"/bin/true"}, dir.file("host.log"), kToken)};
  ASSERT_FALSE(wait_for_text(dir.file("host.log"), "waiting for 2 node", 30s).empty()) << read_file(dir / "host.log");
  const CommandResult other = run_command(fmt::format(
      "DTRAIN_TOKEN=shared-node-secret timeout -s KILL 60 {} --nnodes 2 --node-rank 1 --rdzv-endpoint {} --rdzv-id b "
      "--log-dir {} -- /bin/true", launcher(), endpoint, dir.file("logs1")));
  ::kill(host[0].pid, SIGTERM);
  wait_all(host, 30s);
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_THAT(other.output, HasSubstr("--rdzv-id b differs from the run id a of the agent hosting the store"));
}

}  // namespace
}  // namespace dtrain::testing
