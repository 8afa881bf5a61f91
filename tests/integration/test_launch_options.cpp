// dtrain-launch's pure parts: the command line (torchrun's spellings, where
// the program starts, --nproc-per-node auto|cpu|gpu, Python programs) and its
// completion from Slurm's variables (srun --ntasks-per-node=1 dtrain-launch
// ...), torchrun's options that dtrain answers its own way (--rdzv-backend,
// --tee, --redirects, --local-addr, --standalone --nnodes 1), the workers'
// environment (dtrain's contract and torchrun's, the error file), the logs
// an earlier job leaves, and the hang monitor's verdicts from heartbeats.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "cluster/slurm_store.h"
#include "core/error.h"
#include "launcher/error_file.h"
#include "launcher/hang_monitor.h"
#include "launcher/log_pump.h"
#include "launcher/options.h"
#include "launcher/worker_env.h"
#include "support/temp_dir.h"

namespace dtrain::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// A node of 8 CPUs and no GPU unless the test says otherwise.
LaunchOptions parse(std::vector<std::string> args, const cluster::EnvMap& env = {},
                    const NodeResources& node = {8, 0}) {
  args.insert(args.begin(), "dtrain-launch");
  LaunchOptions o = parse_command_line(args, nullptr);
  resolve_options(o, env, node);
  return o;
}

// Parsing `args` throws an Error whose message has `text`.
void expect_error(const std::vector<std::string>& args, const std::string& text) {
  EXPECT_THAT([&] { parse(args); }, ::testing::ThrowsMessage<Error>(HasSubstr(text)));
}

using Command = std::vector<std::string>;
using dtrain::testing::read_file;
using dtrain::testing::TempDir;

void put(const std::filesystem::path& file, const std::string& text) { std::ofstream(file) << text; }

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

TEST(LaunchOptions, TorchrunSpellingsAreAliasesAndTheProgramIsTheFirstPositional) {
  const LaunchOptions o = parse({"--nnodes", "2", "--node_rank", "1", "--rdzv_endpoint", "n0:29400", "--rdzv_id",
                                 "j7", "--nproc_per_node", "3", "--max_restarts", "2", "train.py", "--lr", "1e-3",
                                 "--nproc_per_node", "9"});
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(*o.node_rank, 1);
  EXPECT_EQ(o.endpoint_host, "n0");
  EXPECT_EQ(o.endpoint_port, 29400);
  EXPECT_EQ(o.run_id, "j7");
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(o.command, (Command{"python3", "-u", "train.py", "--lr", "1e-3", "--nproc_per_node", "9"}));
  EXPECT_EQ(parse({"--nproc-per-node=2", "--", "--weird-program"}).command, Command{"--weird-program"});
}

TEST(LaunchOptions, AnUnknownOptionBeforeTheProgramIsAnErrorNamingIt) {
  expect_error({"--master-addr", "127.0.0.1", "--master-port", "29500", "--bogus", "--", "true"},
               "unknown option '--bogus' before the program: it is not a dtrain-launch option");
  expect_error({"--standalone", "--verbose=1", "true"}, "unknown option '--verbose'");
  expect_error({"--nproc-per-node"}, "--nproc-per-node");  // its value is missing
  EXPECT_THAT([&] { parse({"--rdzv-conf", "x=1", "--", "true"}); },
              ::testing::ThrowsMessage<Error>(Not(HasSubstr("put the program's own options after it"))));
}

TEST(LaunchOptions, StandaloneTakesTorchrunsNnodesOfOne) {
  for (const auto& nnodes : {std::vector<std::string>{"--nnodes=1"}, {"--nnodes", "1"}, {"--nnodes", "1:1"}}) {
    std::vector<std::string> args = {"--standalone"};
    args.insert(args.end(), nnodes.begin(), nnodes.end());
    args.insert(args.end(), {"--nproc-per-node", "2", "--", "p"});
    const LaunchOptions o = parse(args);
    EXPECT_TRUE(o.standalone) << nnodes.front();
    EXPECT_EQ(o.max_nodes, 1);
  }
  expect_error({"--standalone", "--nnodes=2", "--", "p"}, "--nnodes unless it is 1");
  expect_error({"--standalone", "--nnodes", "1:2", "--", "p"}, "--standalone");
}

TEST(LaunchOptions, RdzvBackendC10dAndStaticMeanDtrainsStore) {
  for (const std::string spelling : {"--rdzv-backend", "--rdzv_backend"}) {
    for (const std::string backend : {"c10d", "static"}) {
      const LaunchOptions o = parse({spelling, backend, "--rdzv_endpoint", "n0:29400", "--nnodes", "2", "--", "p"});
      EXPECT_EQ(o.endpoint_host, "n0") << spelling << " " << backend;
      EXPECT_EQ(parse({spelling + "=" + backend, "--standalone", "--", "p"}).command, Command{"p"});
    }
  }
  expect_error({"--rdzv_backend", "zookeeper", "--", "p"},
               "--rdzv-backend 'zookeeper' is not one dtrain-launch takes: c10d or static");
}

TEST(LaunchOptions, RdzvBackendEtcdTakesEtcdsEndpointsAndNeedsARunId) {
  const LaunchOptions o = parse({"--rdzv-backend", "etcd", "--rdzv-endpoint", "h1:2379,h2,[::1]:2380", "--rdzv-id",
                                 "job", "--nnodes", "1:3", "--", "p"});
  EXPECT_TRUE(o.etcd);
  EXPECT_FALSE(o.standalone);
  ASSERT_EQ(o.etcd_endpoints.size(), 3u);
  EXPECT_EQ(o.etcd_endpoints[1].host, "h2");
  EXPECT_EQ(o.etcd_endpoints[1].port, 2379);  // etcd's own port when none is given
  EXPECT_EQ(o.etcd_endpoints[2].host, "::1");
  EXPECT_EQ(o.etcd_endpoints[2].port, 2380);
  EXPECT_TRUE(o.notes.empty());
  // torchrun's etcd-v2: the same backend, with a note that it speaks etcd's v3 API.
  const LaunchOptions v2 = parse({"--rdzv_backend", "etcd-v2", "--rdzv_endpoint", "h1:2379", "--rdzv-id", "job",
                                  "--nnodes", "2", "--", "p"});
  EXPECT_TRUE(v2.etcd);
  ASSERT_EQ(v2.notes.size(), 1u);
  EXPECT_THAT(v2.notes[0], HasSubstr("speaks etcd's v3 API"));
  // Slurm's job id is the run id when --rdzv-id is not given.
  EXPECT_EQ(parse({"--rdzv-backend", "etcd", "--rdzv-endpoint", "h1", "--nnodes", "2", "--", "p"},
                  {{"SLURM_JOB_ID", "77"}}).run_id, "77");
  expect_error({"--rdzv-backend", "etcd", "--rdzv-endpoint", "h1:2379", "--nnodes", "2", "--", "p"},
               "--rdzv-backend etcd needs --rdzv-id");
  expect_error({"--rdzv-backend", "etcd", "--nnodes", "2", "--", "p"},
               "--rdzv-backend etcd needs --rdzv-endpoint with etcd's client endpoints");
  expect_error({"--rdzv-backend", "etcd", "--standalone", "--", "p"}, "drop one of them");
  expect_error({"--rdzv-backend", "etcd", "--rdzv-endpoint", "h1:2379,,h2", "--rdzv-id", "j", "--", "p"},
               "--rdzv-endpoint='h1:2379,,h2' has an empty entry");
  expect_error({"--rdzv-backend", "etcd", "--rdzv-endpoint", "h1:x", "--rdzv-id", "j", "--", "p"},
               "the port must be a number");
}

TEST(LaunchOptions, TeeAndRedirectsAreAcceptedWithANoteOnWhatDtrainDoes) {
  const LaunchOptions o = parse({"--tee", "3", "--redirects=3", "--log-dir", "out", "--", "p"});
  ASSERT_EQ(o.notes.size(), 2u);
  EXPECT_THAT(o.notes[0], HasSubstr("--tee 3: accepted"));
  EXPECT_THAT(o.notes[0], HasSubstr("out/rank_K.log"));
  EXPECT_THAT(o.notes[1], HasSubstr("--redirects 3: accepted"));
  EXPECT_EQ(parse({"-t", "0:3,1:2", "-r", "1", "p"}).notes.size(), 2u);
  EXPECT_TRUE(parse({"--", "p"}).notes.empty());
  expect_error({"--tee", "5", "--", "p"}, "--tee '5' is not torchrun's form");
  expect_error({"--redirects", "all", "--", "p"}, "--redirects 'all'");
}

TEST(LaunchOptions, LocalAddrIsTheNameThisNodeAdvertises) {
  EXPECT_EQ(parse({"--local_addr", "10.0.0.7", "--", "p"}).local_addr, "10.0.0.7");
  EXPECT_EQ(parse({"--local-addr=node7", "--", "p"}).local_addr, "node7");
  EXPECT_EQ(parse({"--", "p"}).local_addr, "");
  expect_error({"--local-addr", "a b", "--", "p"}, "--local-addr 'a b'");
}

TEST(LaunchOptions, WithoutRdzvIdTheRunIdIsLeftForTheAgentToMake) {
  EXPECT_EQ(parse({"--standalone", "--", "p"}).run_id, "");
  EXPECT_EQ(parse({"--nnodes", "2", "--rdzv-endpoint", "n0:1", "--", "p"}).run_id, "");
  EXPECT_EQ(parse({"--rdzv_id", "mine", "--", "p"}).run_id, "mine");
}

TEST(LaunchOptions, MasterAddrAndPortNameTheEndpointAsInTorchrun) {
  LaunchOptions o = parse({"--master_addr", "10.1.2.3", "--master-port", "29511", "--nnodes", "2", "--", "p"});
  EXPECT_EQ(o.endpoint_host, "10.1.2.3");
  EXPECT_EQ(o.endpoint_port, 29511);
  EXPECT_FALSE(o.standalone);
  o = parse({"--master-port", "29512", "--", "p"});  // one node: the agent hosts the store there
  EXPECT_EQ(o.endpoint_host, "127.0.0.1");
  EXPECT_EQ(o.endpoint_port, 29512);
  EXPECT_EQ(parse({"--master-addr", "::1", "--", "p"}).endpoint_port, 29500);
  expect_error({"--master-addr", "h", "--rdzv-endpoint", "h:1", "--", "p"}, "give one");
  expect_error({"--standalone", "--master-port", "29500", "--", "p"}, "--standalone");
}

TEST(LaunchOptions, NprocPerNodeCountsAsTorchrunDoes) {
  EXPECT_EQ(resolve_nproc_per_node("4", {8, 2}), 4);
  EXPECT_EQ(resolve_nproc_per_node("cpu", {8, 2}), 8);
  EXPECT_EQ(resolve_nproc_per_node("gpu", {8, 2}), 2);
  EXPECT_EQ(resolve_nproc_per_node("auto", {8, 2}), 2);
  EXPECT_EQ(resolve_nproc_per_node("auto", {8, 0}), 8);
  EXPECT_EQ(parse({"--nproc-per-node", "auto", "--", "p"}, {}, {3, 0}).nproc_per_node, 3);
  EXPECT_THROW(resolve_nproc_per_node("gpu", {8, 0}), Error);
  EXPECT_THROW(resolve_nproc_per_node("two", {8, 0}), Error);
  EXPECT_EQ(detect_node_resources({{"CUDA_VISIBLE_DEVICES", "0,3"}}).gpus, 2);
  EXPECT_EQ(detect_node_resources({{"CUDA_VISIBLE_DEVICES", ""}}).gpus, 0);
  EXPECT_GE(detect_node_resources({}).cpus, 1);
}

TEST(LaunchOptions, PythonProgramsRunAsTorchrunRunsThem) {
  EXPECT_EQ(parse({"--", "train.py", "-x"}).command, (Command{"python3", "-u", "train.py", "-x"}));
  EXPECT_EQ(parse({"-m", "pkg.train", "-x"}).command, (Command{"python3", "-u", "-m", "pkg.train", "-x"}));
  EXPECT_EQ(parse({"--module", "--", "pkg.train"}).command, (Command{"python3", "-u", "-m", "pkg.train"}));
  EXPECT_EQ(parse({"--no-python", "tool.py"}).command, Command{"tool.py"});
  EXPECT_EQ(parse({"--", "dtrain-worker", "a.py"}).command, (Command{"dtrain-worker", "a.py"}));
  expect_error({"--no_python", "-m", "x"}, "--no-python and --module");
}

TEST(LaunchOptions, HelpShowsTheProgramFormAndEveryDefaultAndVersionTheVersion) {
  std::string message;
  parse_command_line({"dtrain-launch", "--help"}, &message);
  EXPECT_THAT(message, HasSubstr("Usage: dtrain-launch [OPTIONS] [--] PROGRAM [ARGS...]"));
  for (const char* shown : {"--nproc-per-node,--nproc_per_node TEXT=1", "--rdzv-timeout FLOAT=600",
                            "--log-dir TEXT=logs", "--master-port,--master_port INT=29500", "--metrics-linger FLOAT=0",
                            "--hang-timeout FLOAT=300", "--node-rank,--node_rank INT=arrival order",
                            "--rdzv-backend,--rdzv_backend TEXT=c10d", "c10d or static (both: dtrain's built-in",
                            "-t,--tee TEXT=3 (always)", "-r,--redirects TEXT=3 (always)",
                            "always go to LOG_DIR/rank_K.log and to the console", "--local-addr,--local_addr TEXT=hostname",
                            "--rdzv-id,--rdzv_id TEXT=$SLURM_JOB_ID, else a fresh one per job"}) {
    EXPECT_THAT(message, HasSubstr(shown));
  }
  message.clear();
  parse_command_line({"dtrain-launch", "--version"}, &message);
  EXPECT_THAT(message, ::testing::MatchesRegex("dtrain-launch [0-9.]+\n"));
}

TEST(WorkerEnvironment, CarriesDtrainsContractAndTorchrunsOverTheAgentsOwn) {
  LaunchOptions o = parse({"--nnodes", "2", "--rdzv-endpoint", "n0:29400", "--rdzv-id", "j", "--nproc-per-node", "2",
                           "--max-restarts", "3", "--", "p"});
  const RoundPlan plan{.round = 4, .node_rank = 1, .num_nodes = 2, .world_size = 4, .rank_base = 2, .nodes = {}};
  const cluster::EnvMap agent = {{"HOME", "/root"}, {"RANK", "9"}, {"OMPI_COMM_WORLD_RANK", "1"},
                                 {"DTRAIN_RANK", "1"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  auto env = worker_base_environment(o, plan, agent, {"tok", 31000, 2, 0.5, false});
  const auto rank = worker_rank_environment(3, 1, "/l/j/attempt_4/3/error.json");
  env.insert(rank.begin(), rank.end());
  const std::map<std::string, std::string> want = {
      {"HOME", "/root"}, {"RANK", "3"}, {"LOCAL_RANK", "1"}, {"ROLE_RANK", "3"}, {"WORLD_SIZE", "4"},
      {"ROLE_WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"},
      {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "31000"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"}, {"TORCHELASTIC_RUN_ID", "j"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"DTRAIN_RANK", "3"}, {"DTRAIN_LOCAL_RANK", "1"}, {"DTRAIN_WORLD_SIZE", "4"}, {"DTRAIN_NODE_RANK", "1"},
      {"DTRAIN_STORE", "n0:29400"}, {"DTRAIN_RESTART", "4"}, {"DTRAIN_RUN_ID", "j"}, {"DTRAIN_TOKEN", "tok"},
      {"DTRAIN_HEARTBEAT_S", "0.5"}, {"OMP_NUM_THREADS", "1"}, {"DTRAIN_OMP_DEFAULTED", "1"},
      {"TORCHELASTIC_ERROR_FILE", "/l/j/attempt_4/3/error.json"}};
  for (const auto& [k, v] : want) EXPECT_EQ(env[k], v) << k;
  EXPECT_EQ(env.count("OMPI_COMM_WORLD_RANK"), 0u);
  // With etcd, the workers get etcd's endpoints and MASTER_ADDR is node rank 0's advertised name.
  LaunchOptions e = parse({"--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "e1:2379,e2", "--rdzv-id", "j",
                           "--", "p"});
  RoundPlan two = plan;
  two.nodes = {NodeInfo{false, 0, 2, "node-a", 0}, NodeInfo{false, 1, 2, "node-b", 1}};
  const auto etcd_env = worker_base_environment(e, two, {}, {"tok", 31000, 0, 0, false});
  EXPECT_EQ(etcd_env.at("DTRAIN_STORE"), "etcd://e1:2379,e2:2379");
  EXPECT_EQ(etcd_env.at("MASTER_ADDR"), "node-a");
  // The user's OMP_NUM_THREADS stays theirs; one worker per node gets none.
  const auto chosen = worker_base_environment(o, plan, {{"OMP_NUM_THREADS", "4"}}, {"tok", 31000, 0, 0, false});
  EXPECT_EQ(chosen.at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(chosen.count("DTRAIN_OMP_DEFAULTED"), 0u);
  o.nproc_per_node = 1;
  EXPECT_EQ(worker_base_environment(o, plan, {}, {"tok", 31000, 0, 0, false}).count("OMP_NUM_THREADS"), 0u);
}

TEST(WorkerEnvironment, ErrorFileLiesUnderTheLogFolderPerRunAttemptAndRank) {
  EXPECT_EQ(error_file_path("/l", "j", 4, 3), std::filesystem::path("/l/j/attempt_4/3/error.json"));
  TempDir dir;
  const auto file = prepare_error_file(dir / "logs", "run1", 0, 1);
  EXPECT_EQ(file, dir / "logs" / "run1" / "attempt_0" / "1" / "error.json");
  EXPECT_TRUE(std::filesystem::is_directory(file.parent_path()));
  EXPECT_FALSE(read_error_message(file));
  // What torch.distributed.elastic's @record writes, and the plain form.
  put(file, R"({"message": {"message": "RuntimeError: boom", "extraInfo": )"
                                    R"({"py_callstack": "Traceback ...", "timestamp": "1"}}})");
  EXPECT_EQ(read_error_message(file), "RuntimeError: boom");
  put(file, R"({"message": "Signal 9 (SIGKILL) received"})");
  EXPECT_EQ(read_error_message(file), "Signal 9 (SIGKILL) received");
  put(file, "not json");
  EXPECT_FALSE(read_error_message(file));
  prepare_error_file(dir / "logs", "run1", 0, 1);  // an earlier job's file is not this one's
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST(WorkerLogs, AnEarlierJobsLogIsKeptAsDotOneAndOlderOnesMoveUp) {
  TempDir dir;
  const auto log = dir / "rank_0.log";
  keep_previous_log(log);  // nothing yet: nothing to keep
  EXPECT_FALSE(std::filesystem::exists(log));
  put(log, "job 1\n");
  keep_previous_log(log);
  put(log, "job 2\n");
  keep_previous_log(log);
  put(log, "job 3\n");
  EXPECT_EQ(read_file(log), "job 3\n");
  EXPECT_EQ(read_file(dir / "rank_0.log.1"), "job 2\n");
  EXPECT_EQ(read_file(dir / "rank_0.log.2"), "job 1\n");
  EXPECT_FALSE(std::filesystem::exists(dir / "rank_0.log.3"));
}

TEST(WorkerLogs, ALineWithTheRanksOwnPyTorchPrefixIsNotPrefixedAgain) {
  EXPECT_EQ(console_line(1, "[rank1]: Traceback (most recent call last):"), "[rank1]: Traceback (most recent call last):");
  EXPECT_EQ(console_line(1, "step 3"), "[rank 1] step 3");
  EXPECT_EQ(console_line(1, "[rank0]: another rank's line"), "[rank 1] [rank0]: another rank's line");
  EXPECT_EQ(console_line(12, "[rank1]: x"), "[rank 12] [rank1]: x");
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

TEST(HangMonitor, RanksThatNeverHeartbeatAreNotWatched) {
  const auto t0 = HangMonitor::Clock::now();
  HangMonitor m(2, 1s, 2s, t0);
  // A program that sends no heartbeat (a PyTorch script) runs as long as it likes.
  for (int s = 0; s <= 600; s += 10) {
    const auto t = t0 + std::chrono::seconds(s);
    m.observe(0, std::nullopt, t);
    m.observe(1, std::nullopt, t);
    EXPECT_FALSE(m.check(t)) << "at " << s << " s";
  }
  EXPECT_FALSE(m.unwatched(t0 + 500ms));
  EXPECT_TRUE(m.unwatched(t0 + 1s));
  // Once one rank heartbeats, it is watched; the silent one is named, not blamed.
  m.observe(0, telemetry::parse_heartbeat("beat=1 step=2 phase=forward seq=3"), t0 + 601s);
  EXPECT_FALSE(m.unwatched(t0 + 601s));
  EXPECT_FALSE(m.check(t0 + 601500ms));
  const auto report = m.check(t0 + 603s);
  ASSERT_TRUE(report);
  EXPECT_THAT(*report, HasSubstr("silent: rank(s) 1 never sent a heartbeat"));
  EXPECT_THAT(*report, Not(HasSubstr("stuck: rank(s) 0, 1")));
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
