// dtrain-launch's pure parts: the command line and its completion from
// Slurm's variables (srun --ntasks-per-node=1 dtrain-launch ...), and the
// hang monitor's verdicts from heartbeats.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cluster/slurm_store.h"
#include "core/error.h"
#include "launcher/hang_monitor.h"
#include "launcher/options.h"

namespace dtrain::launcher {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

LaunchOptions parse(std::vector<std::string> args, const cluster::EnvMap& env = {}) {
  args.insert(args.begin(), "dtrain-launch");
  LaunchOptions o = parse_command_line(args, nullptr);
  resolve_options(o, env);
  return o;
}

TEST(LaunchOptions, StandaloneTakesTheProgramAfterTheSeparator) {
  const LaunchOptions o = parse({"--standalone", "--nproc-per-node", "4", "--", "prog", "--config", "x.json"});
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--config", "x.json"}));
  EXPECT_EQ(o.endpoint_host, "127.0.0.1");
}

TEST(LaunchOptions, ElasticRangeAndEndpoint) {
  const LaunchOptions o = parse({"--nnodes", "2:4", "--rdzv-endpoint", "n1:29400", "--rdzv-id", "j", "--", "p"});
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.max_nodes, 4);
  EXPECT_TRUE(o.elastic());
  EXPECT_EQ(o.endpoint_host, "n1");
  EXPECT_EQ(o.endpoint_port, 29400);
  EXPECT_EQ(o.run_id, "j");
}

TEST(LaunchOptions, SlurmVariablesFillNodesRankEndpointAndRunId) {
  const cluster::EnvMap env = {{"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NNODES", "3"},
                               {"SLURM_NODEID", "2"}, {"SLURM_STEP_NODELIST", "gpu[07-09]"}};
  const LaunchOptions o = parse({"--nproc-per-node", "2", "--", "p"}, env);
  EXPECT_TRUE(o.from_slurm);
  EXPECT_EQ(o.max_nodes, 3);
  EXPECT_EQ(*o.node_rank, 2);
  EXPECT_EQ(o.endpoint_host, "gpu07");
  EXPECT_EQ(o.endpoint_port, cluster::slurm_store_port("4242", "0"));
  EXPECT_EQ(o.run_id, "4242");
  cluster::EnvMap with_port = env;
  with_port["DTRAIN_STORE_PORT"] = "23456";
  EXPECT_EQ(parse({"--", "p"}, with_port).endpoint_port, 23456);
}

TEST(LaunchOptions, MistakesAreErrorsThatSayWhatToDo) {
  EXPECT_THROW(parse({"--standalone"}), Error);                                       // no program
  EXPECT_THROW(parse({"--nnodes", "2", "--", "p"}), Error);                           // no endpoint
  EXPECT_THROW(parse({"--nnodes", "3:2", "--rdzv-endpoint", "h:1", "--", "p"}), Error);
  EXPECT_THROW(parse({"--standalone", "--nnodes", "2", "--", "p"}), Error);
  try {
    parse({"--nnodes", "2", "--", "p"});
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--rdzv-endpoint"));
  }
  try {
    parse({"--nnodes", "2", "--", "p"}, {{"SLURM_JOB_ID", "1"}});
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("srun --ntasks-per-node=1"));
  }
}

TEST(HangMonitor, ParsesHeartbeats) {
  const auto h = telemetry::parse_heartbeat("beat=7 step=12 phase=backward seq=88");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->beat, 7);
  EXPECT_EQ(h->step, 12);
  EXPECT_EQ(h->phase, "backward");
  EXPECT_EQ(h->seq, 88u);
  EXPECT_FALSE(telemetry::parse_heartbeat("hello"));
}

TEST(HangMonitor, NamesTheMissingRankAndTheStuckOnes) {
  const auto t0 = HangMonitor::Clock::now();
  HangMonitor m(3, 10s, 2s, t0);
  for (int r = 0; r < 3; ++r) m.observe(r, telemetry::parse_heartbeat("beat=1 step=5 phase=forward seq=40"), t0);
  // Ranks 0 and 2 reach collective #41 and wait; rank 1 freezes at #40.
  for (int s = 1; s <= 12; ++s) {
    const auto t = t0 + std::chrono::seconds(s);
    m.observe(0, telemetry::parse_heartbeat(fmt::format("beat={} step=5 phase=backward seq=41", s + 1)), t);
    m.observe(1, telemetry::parse_heartbeat("beat=1 step=5 phase=forward seq=40"), t);
    m.observe(2, telemetry::parse_heartbeat(fmt::format("beat={} step=5 phase=backward seq=41", s + 1)), t);
    if (s < 11) {
      EXPECT_FALSE(m.check(t)) << "at " << s << " s";
    }
  }
  const auto report = m.check(t0 + 12s);
  ASSERT_TRUE(report);
  EXPECT_THAT(*report, HasSubstr("missing: rank(s) 1 stopped heartbeating"));
  EXPECT_THAT(*report, HasSubstr("stuck: rank(s) 0, 2 waiting"));
  EXPECT_THAT(*report, HasSubstr("rank 1: step 5, phase forward, collective #40"));
}

TEST(HangMonitor, ARankThatStillBeatsButIsBehindIsNamed) {
  const auto t0 = HangMonitor::Clock::now();
  HangMonitor m(2, 5s, 2s, t0);
  for (int s = 0; s <= 6; ++s) {
    const auto t = t0 + std::chrono::seconds(s);
    m.observe(0, telemetry::parse_heartbeat(fmt::format("beat={} step=3 phase=optimizer seq=9", s)), t);
    m.observe(1, telemetry::parse_heartbeat(fmt::format("beat={} step=3 phase=forward seq=8", s)), t);
  }
  const auto report = m.check(t0 + 6s);
  ASSERT_TRUE(report);
  EXPECT_THAT(*report, HasSubstr("behind: rank(s) 1 never reached collective #9"));
}

}  // namespace
}  // namespace dtrain::launcher
