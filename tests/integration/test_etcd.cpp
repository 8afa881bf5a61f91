// etcd as the control plane: the Store contract against EtcdStore on a
// 3-member etcd cluster of the test's own (loopback); failover when a member
// dies; the lease of set keys (revoked, and expired after a SIGKILL); and
// dtrain-launch --rdzv-backend etcd: two agents train as by hand while an
// etcd member is killed, an elastic job goes on at one node after the agent
// that started first is killed with SIGKILL, a job that loses etcd's quorum
// stops with a checkpoint and resumes once etcd is back, and an unreachable
// endpoint or an etcd without quorum at start is a one-line error. Skips,
// saying why, where the etcd binary is absent (scripts/setup.sh installs it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "comm/etcd_store.h"
#include "core/error.h"
#include "integration/launch_testing.h"
#include "integration/netns_testing.h"
#include "support/etcd_cluster.h"
#include "support/store_contract.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// One cluster for the contract's tests (each gets a prefix of its own).
EtcdCluster& shared_cluster() {
  static EtcdCluster cluster;
  static const std::string started = cluster.start();
  if (!started.empty()) throw std::runtime_error(started);
  return cluster;
}

comm::EtcdStore::Options etcd_options(const std::string& endpoints, const std::string& prefix = "dtrain-test/") {
  comm::EtcdStore::Options o;
  o.endpoints = cluster::parse_etcd_endpoints(endpoints, "test endpoints");
  o.prefix = prefix;
  o.connect_timeout = 5s;
  o.timeout = 10s;
  o.attempt_timeout = 2s;
  return o;
}

struct EtcdBackend {
  static constexpr int kConcurrentClients = 8;  // add is a compare-and-swap: etcd has no increment
  static constexpr int kAddsEach = 25;
  static std::string missing() { return etcd_binary().empty() ? kNoEtcd : ""; }
  std::string prefix = fmt::format("contract-{}-{}/", ::getpid(), next());
  std::shared_ptr<Store> client() {
    return std::make_shared<comm::EtcdStore>(etcd_options(shared_cluster().endpoints(), prefix));
  }
  static int next() {
    static std::atomic<int> n{0};
    return n++;
  }
};

struct EtcdName {
  template <class T>
  static std::string GetName(int) {
    return "Etcd";
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Etcd, StoreContract, ::testing::Types<EtcdBackend>, EtcdName);

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(etcd_binary().empty()) << kNoEtcd;
  }
};

TEST_F(EtcdStoreTest, GoesOnThroughTheOtherMembersWhenTheFirstEndpointDies) {
  EtcdCluster cluster;
  ASSERT_EQ(cluster.start(), "");
  comm::EtcdStore store(etcd_options(cluster.endpoints()));
  comm::EtcdStore other(etcd_options(cluster.endpoints()));
  store.set("before", comm::to_bytes("1"));
  EXPECT_EQ(store.add("n", 1), 1);
  cluster.kill(0);  // the endpoint both clients talk to
  EXPECT_EQ(comm::to_string(store.get("before", 1s)), "1");
  store.set("after", comm::to_bytes("2"));
  EXPECT_EQ(store.add("n", 1), 2);
  EXPECT_EQ(comm::to_string(other.get("after", 5s)), "2");
  EXPECT_EQ(other.add("n", 1), 3);
}

TEST_F(EtcdStoreTest, NoEndpointAnsweringIsACommErrorNamingEachWithinTheTimeout) {
  const int dead1 = free_port(), dead2 = free_port();
  auto options = etcd_options(fmt::format("127.0.0.1:{},127.0.0.1:{}", dead1, dead2));
  options.connect_timeout = 500ms;
  try {
    comm::EtcdStore store(options);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}: cannot connect", dead1)));
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}: cannot connect", dead2)));
    EXPECT_THAT(e.what(), HasSubstr("within 500 ms"));
    EXPECT_THAT(std::string(e.what()), Not(HasSubstr("\n")));
  }
}

TEST_F(EtcdStoreTest, SetKeysCarryTheLeaseAndGoWithItCountersStay) {
  EtcdCluster& cluster = shared_cluster();
  const std::string prefix = fmt::format("lease-{}/", ::getpid());
  comm::EtcdStore watcher(etcd_options(cluster.endpoints(), prefix));
  {
    auto options = etcd_options(cluster.endpoints(), prefix);
    options.lease_ttl = 3s;
    comm::EtcdStore agent(options);
    agent.set("node/0", comm::to_bytes("mine"));
    agent.add("joined", 1);
    EXPECT_EQ(comm::to_string(agent.compare_set("end", {}, comm::to_bytes("why"))), "why");
    std::this_thread::sleep_for(4s);  // past the TTL: the keep-alive held it
    EXPECT_TRUE(watcher.check("node/0"));
  }  // destroyed: the lease is revoked
  EXPECT_FALSE(watcher.check("node/0"));
  EXPECT_EQ(watcher.add("joined", 0), 1);
  EXPECT_EQ(comm::to_string(watcher.get("end", 1s)), "why");
  EXPECT_EQ(watcher.delete_prefix(""), 2);
  EXPECT_EQ(watcher.num_keys(), 0);
}

// A process that dies without a word (SIGKILL) leaves its set keys behind
// only until its lease's TTL runs out; its counters stay.
TEST_F(EtcdStoreTest, SetKeysOfAKilledProcessExpireWithItsLease) {
  EtcdCluster& cluster = shared_cluster();
  const std::string prefix = fmt::format("expiry-{}/", ::getpid());
  comm::EtcdStore watcher(etcd_options(cluster.endpoints(), prefix));
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the "agent": sets its record, says so, and waits to be killed
    try {
      auto options = etcd_options(cluster.endpoints(), prefix);
      options.lease_ttl = 2s;
      comm::EtcdStore agent(options);
      agent.set("node/0", comm::to_bytes("mine"));
      agent.add("joined", 1);
      (void)!::write(ready[1], "x", 1);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(1);
    }
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the child never set its keys";
  ::close(ready[0]);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(watcher.check("node/0"));  // the lease outlives the process for up to its TTL
  EXPECT_TRUE(eventually([&] { return !watcher.check("node/0"); }, 15s)) << "the record never expired";
  EXPECT_EQ(watcher.add("joined", 0), 1);
  watcher.delete_prefix("");
}

// Two agents (node ranks 0 and 1) with --rdzv-backend etcd, each a worker.
std::vector<std::string> etcd_node_args(const std::string& nnodes, int rank, const std::string& endpoints,
                                        const std::string& run_id, const TempDir& dir) {
  return {"--nnodes", nnodes, "--node-rank", std::to_string(rank), "--rdzv-backend", "etcd", "--rdzv-endpoint",
          endpoints, "--rdzv-id", run_id, "--nproc-per-node", "1", "--rdzv-timeout", "60", "--log-dir",
          dir.file(fmt::format("logs{}", rank))};
}

class LaunchEtcd : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(etcd_binary().empty()) << kNoEtcd;
    ASSERT_EQ(cluster_.start(), "");
  }
  EtcdCluster cluster_;
};

TEST_F(LaunchEtcd, TwoNodesTrainToTheEndAsByHandWhileAnEtcdMemberIsKilled) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::vector<std::string> sets = {"train.steps=600"};  // long enough to be running at the kill
  ASSERT_TRUE(run_by_hand(dir, 2, worker_command(config, dir / "hand", sets))) << read_file(dir / "hand0.log");
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    auto args = etcd_node_args("2", node, cluster_.endpoints(), "etcd-two", dir);
    if (node == 1) args[5] = "etcd-v2";  // torchrun's spelling
    agents.push_back(start_launch(args, worker_command(config, dir / "run", sets),
                                  dir.file(fmt::format("agent{}.log", node))));
  }
  const std::string log0 = dir.file("agent0.log");
  ASSERT_FALSE(wait_for_text(log0, "step +50/600", 60s).empty()) << read_file(log0);
  cluster_.kill(0);  // the first endpoint of both agents and of every worker
  ASSERT_THAT(read_file(log0), Not(HasSubstr("all workers of every node finished")))
      << "the job ended before the etcd member was killed: this test needs a longer one";
  ASSERT_TRUE(wait_all(agents, 120s)) << read_file(log0) << read_file(dir / "agent1.log");
  for (auto& a : agents) ASSERT_EQ(a.exit_code(), 0) << a.log();
  EXPECT_THAT(agents[0].log(), Not(HasSubstr("hosting the run's store")));
  EXPECT_THAT(agents[1].log(), HasSubstr("round 0: node 1 of 2, ranks 1-1 of 2"));
  EXPECT_THAT(agents[1].log(), HasSubstr("--rdzv-backend etcd-v2: torchrun's name"));
  EXPECT_THAT(agents[1].log(), HasSubstr("speaks etcd's v3 API"));
  EXPECT_THAT(agents[0].log(), Not(HasSubstr("round 1")));
  // Unaffected: the same steps and losses as the job started by hand.
  EXPECT_EQ(comparable_metrics(dir / "run" / "metrics.jsonl"), comparable_metrics(dir / "hand" / "metrics.jsonl"));
  // The last agent to leave removed the job's keys.
  const CommandResult left = run_command(fmt::format(
      "ETCDCTL_API=3 timeout -s KILL 10 etcdctl --endpoints {} get --prefix --keys-only dtrain/etcd-two/",
      cluster_.endpoints()));
  EXPECT_EQ(left.exit_code, 0) << left.output;
  EXPECT_THAT(left.output, Not(HasSubstr("dtrain/etcd-two/"))) << left.output;
}

// Two "hosts" (network namespaces A and B), etcd's members spread over
// them: the agents reach etcd and each other at 198.51.100.x, the workers
// listen on their host's own address (its name resolves to it there).
TEST(LaunchEtcdNamespaces, TwoAgentsInTwoNetworkNamespacesTrainThroughEtcd) {
  ASSERT_FALSE(etcd_binary().empty()) << kNoEtcd;
  Namespaces ns;
  const std::string why = ns.make();
  ASSERT_TRUE(why.empty()) << "cannot make two network namespaces (needs root and iproute2, which "
                              "scripts/setup.sh installs): " << why;
  EtcdCluster cluster({{"198.51.100.1", in_namespace(ns.a())}, {"198.51.100.2", in_namespace(ns.b())},
                       {"198.51.100.1", in_namespace(ns.a())}});
  ASSERT_EQ(cluster.start(), "");
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = in_namespace(node == 0 ? ns.a() : ns.b());
    argv.push_back(launcher());
    const auto args = etcd_node_args("2", node, cluster.endpoints(), "etcd-netns", dir);
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--");
    const auto command = worker_command(config, dir / "run");
    argv.insert(argv.end(), command.begin(), command.end());
    agents.push_back(spawn_process(argv, {}, dir.file(fmt::format("agent{}.log", node))));
  }
  ASSERT_TRUE(wait_all(agents, 120s)) << read_file(dir / "agent0.log") << read_file(dir / "agent1.log");
  for (auto& a : agents) ASSERT_EQ(a.exit_code(), 0) << a.log();
  EXPECT_THAT(agents[0].log(), HasSubstr("[rank 0] done: 20 steps"));
  EXPECT_THAT(agents[1].log(), HasSubstr("round 0: node 1 of 2, ranks 1-1 of 2"));
}

// With the built-in store, the agent that started first hosts it and the job
// cannot outlive it; with etcd nobody hosts the store, and an elastic job
// goes on at the smaller world from its checkpoint.
TEST_F(LaunchEtcd, ElasticJobGoesOnAtOneNodeAfterTheFirstAgentIsKilled) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const auto command = worker_command(config, dir / "run", {"train.steps=300", "train.grad_accum_steps=2",
                                                            "checkpoint.every_steps=10", "checkpoint.resume=auto"});
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    auto args = etcd_node_args("1:2", node, cluster_.endpoints(), "etcd-elastic", dir);
    args.insert(args.end(), {"--rdzv-last-call", "5", "--max-restarts", "2", "--stop-timeout", "5"});
    agents.push_back(start_launch(args, command, dir.file(fmt::format("agent{}.log", node))));
    if (node == 0) {
      ASSERT_FALSE(wait_for_text(dir.file("agent0.log"), "waiting for 1-2 node", 30s).empty())
          << read_file(dir / "agent0.log");
    }
  }
  const std::string log0 = dir.file("agent0.log"), log1 = dir.file("agent1.log");
  ASSERT_FALSE(wait_for_text(log1, "round 0: node 1 of 2", 60s).empty()) << read_file(log1);
  ASSERT_FALSE(wait_for_text(log0, "step +30/300", 60s).empty()) << read_file(log0);
  ::kill(agents[0].pid, SIGKILL);  // the first agent: node rank 0, where global rank 0 runs
  ASSERT_TRUE(wait_all(agents, 150s)) << read_file(log1);
  const std::string out = read_file(log1);
  EXPECT_EQ(agents[1].exit_code(), 0) << out;
  EXPECT_THAT(out, HasSubstr("round 1: node 0 of 1, ranks 0-0 of 1"));
  EXPECT_THAT(out, ::testing::ContainsRegex("resumed from .* saved by 2 rank"));
  EXPECT_THAT(out, ::testing::ContainsRegex("\\[rank 0\\] done: [0-9]+ steps \\(steps [0-9]+-300, resumed after step"));
}

// Two members of three killed: etcd has no quorum, the agents say so, stop
// their workers (which save a checkpoint) and exit 1; once the members are
// back, the job started again resumes from that checkpoint.
TEST_F(LaunchEtcd, LosingQuorumStopsTheJobWithACheckpointAndItResumesOnceEtcdIsBack) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const auto command = worker_command(config, dir / "run", {"train.steps=100000", "checkpoint.every_steps=1000"});
  std::vector<Spawned> agents;
  for (int node = 0; node < 2; ++node) {
    auto args = etcd_node_args("2", node, cluster_.endpoints(), "etcd-quorum", dir);
    args.insert(args.end(), {"--stop-timeout", "30"});
    agents.push_back(start_launch(args, command, dir.file(fmt::format("agent{}.log", node))));
  }
  const std::string log0 = dir.file("agent0.log");
  ASSERT_FALSE(wait_for_text(log0, "step +50/100000", 60s).empty()) << read_file(log0);
  cluster_.kill(0);
  cluster_.kill(1);
  ASSERT_TRUE(wait_all(agents, 90s)) << read_file(log0);
  for (int node = 0; node < 2; ++node) {
    const std::string out = agents[static_cast<std::size_t>(node)].log();
    EXPECT_EQ(agents[static_cast<std::size_t>(node)].exit_code(), 1) << out;
    EXPECT_THAT(out, HasSubstr("job stopped: lost the run's store in etcd")) << out;
    EXPECT_THAT(out, HasSubstr("lost its quorum")) << out;
  }
  const auto saved = wait_for_text(log0, "stopping after step ([0-9]+) on signal 15: checkpoint saved", 1s);
  ASSERT_EQ(saved.size(), 2u) << read_file(log0);
  // etcd is back: the job, started again under another run id, resumes from the checkpoint.
  cluster_.restart(0);
  cluster_.restart(1);
  const int resume_steps = std::stoi(saved[1]) + 10;
  const auto again = worker_command(config, dir / "run", {fmt::format("train.steps={}", resume_steps)});
  std::vector<Spawned> resumed;
  for (int node = 0; node < 2; ++node) {
    resumed.push_back(start_launch(etcd_node_args("2", node, cluster_.endpoints(), "etcd-quorum-2", dir), again,
                                   dir.file(fmt::format("again{}.log", node))));
  }
  ASSERT_TRUE(wait_all(resumed, 90s)) << read_file(dir / "again0.log");
  for (auto& a : resumed) EXPECT_EQ(a.exit_code(), 0) << a.log();
  EXPECT_THAT(resumed[0].log(), HasSubstr(fmt::format("resumed from {}", (dir / "run" / "checkpoints").string())));
  EXPECT_THAT(resumed[0].log(), HasSubstr(fmt::format("(step {}, saved by 2 rank(s)", saved[1])));
  EXPECT_THAT(resumed[0].log(), HasSubstr(fmt::format("[rank 0] done: 10 steps (steps {}-{}, resumed after step {})",
                                                      resume_steps - 9, resume_steps, saved[1])));
}

TEST_F(LaunchEtcd, UnreachableEndpointIsAOneLineErrorNamingIt) {
  TempDir dir;
  const int dead = free_port();
  const CommandResult r = run_command(fmt::format(
      "timeout -s KILL 60 {} --nnodes 2 --node-rank 0 --rdzv-backend etcd --rdzv-endpoint 127.0.0.1:{} "
      "--rdzv-id x --rdzv-timeout 3 --log-dir {} -- /bin/true 2>&1",
      launcher(), dead, dir.file("logs")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto error = r.output.find("dtrain-launch: error:");
  ASSERT_NE(error, std::string::npos) << r.output;
  const std::string line = r.output.substr(error, r.output.find('\n', error) - error);
  EXPECT_THAT(line, HasSubstr(fmt::format("127.0.0.1:{}: cannot connect", dead)));
  EXPECT_THAT(line, HasSubstr("--rdzv-endpoint"));
  EXPECT_THAT(r.output.substr(error), ::testing::EndsWith(line + "\n")) << "more than one line";
}

// etcd without a quorum at start (two members of three down): the agent
// gives up within its --rdzv-timeout, saying so in one line.
TEST_F(LaunchEtcd, NoQuorumAtStartIsAOneLineErrorSayingSo) {
  TempDir dir;
  cluster_.kill(0);
  cluster_.kill(1);
  const CommandResult r = run_command(fmt::format(
      "timeout -s KILL 60 {} --nnodes 2 --node-rank 0 --rdzv-backend etcd --rdzv-endpoint {} --rdzv-id x "
      "--rdzv-timeout 8 --log-dir {} -- /bin/true 2>&1",
      launcher(), cluster_.endpoints(), dir.file("logs")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto error = r.output.find("dtrain-launch: error:");
  ASSERT_NE(error, std::string::npos) << r.output;
  const std::string line = r.output.substr(error, r.output.find('\n', error) - error);
  EXPECT_THAT(line, HasSubstr(fmt::format("127.0.0.1:{}: no answer: nothing within", cluster_.client_port(2))));
  EXPECT_THAT(line, HasSubstr("lost its quorum"));
  EXPECT_THAT(r.output.substr(error), ::testing::EndsWith(line + "\n")) << "more than one line";
}

}  // namespace
}  // namespace dtrain::testing
