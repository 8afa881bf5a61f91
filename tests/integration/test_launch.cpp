// dtrain-launch on one node, as real processes: standalone jobs of 1-4 workers
// train exactly what the same job started by hand trains; a worker killed
// with SIGKILL is restarted and the job ends with the loss of an
// uninterrupted run; a SIGSTOPped worker is reported as a hang naming it,
// then restarted; a program that never heartbeats (not a dtrain-worker) is
// not taken for a hang however long it runs; exhausted restarts end with a summary; the launcher's own
// SIGKILL takes every worker with it; a signal to the launcher makes the
// workers save and exit; the store refuses a wrong token; a taken port is a
// clear error. Timeouts here are upper bounds only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "comm/tcp_store.h"
#include "core/error.h"
#include "integration/launch_testing.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Launch, StandaloneJobsTrainWhatTheSameJobStartedByHandTrains) {
  for (int world : {1, 2, 4}) {
    TempDir dir;
    const auto config = dir.write("lm.json", kLaunchLm);
    ASSERT_TRUE(run_by_hand(dir, world, worker_command(config, dir / "hand"))) << read_file(dir / "hand0.log");
    auto launch = start_launch({"--standalone", "--nproc-per-node", std::to_string(world), "--log-dir", dir.file("logs")},
                               worker_command(config, dir / "launched"), dir.file("launch.log"));
    std::vector<Spawned> procs{launch};
    ASSERT_TRUE(wait_all(procs, 120s)) << read_file(dir / "launch.log");
    ASSERT_EQ(procs[0].exit_code(), 0) << read_file(dir / "launch.log");
    const std::string out = read_file(dir / "launch.log");
    EXPECT_THAT(out, HasSubstr(fmt::format("[rank 0] dtrain-worker: lm model, 20 steps")));
    EXPECT_THAT(out, HasSubstr(fmt::format("{} rank(s) (dtrain-launch)", world)));
    EXPECT_THAT(read_file(dir / "logs" / fmt::format("rank_{}.log", world - 1)), Not(HasSubstr("[rank")));
    const auto launched = comparable_metrics(dir / "launched" / "metrics.jsonl");
    ASSERT_FALSE(launched.empty());
    EXPECT_EQ(launched, comparable_metrics(dir / "hand" / "metrics.jsonl")) << "world " << world;
  }
}

TEST(Launch, KilledWorkerIsRestartedAndTheJobEndsWithTheUninterruptedLoss) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::vector<std::string> sets = {"train.steps=300", "train.grad_accum_steps=2", "checkpoint.every_steps=10",
                                         "checkpoint.resume=auto"};
  ASSERT_TRUE(run_by_hand(dir, 2, worker_command(config, dir / "hand", sets))) << read_file(dir / "hand0.log");
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--stop-timeout", "5",
                              "--log-dir", dir.file("logs")},
                             worker_command(config, dir / "run", sets), log);
  const int kill_at = std::uniform_int_distribution<int>(20, 80)(*std::make_unique<std::random_device>());
  SCOPED_TRACE(fmt::format("SIGKILL to rank 1 at step >= {}", kill_at));
  ASSERT_FALSE(wait_for_text(log, fmt::format("step +{}/300", kill_at), 60s).empty()) << read_file(log);
  const auto pids = announced_pids(log, 0);
  ASSERT_EQ(pids.size(), 2u);
  ::kill(pids[1], SIGKILL);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 120s)) << read_file(log);
  const std::string out = read_file(log);
  ASSERT_EQ(procs[0].exit_code(), 0) << out;
  EXPECT_THAT(out, HasSubstr("failed: signal SIGKILL"));
  EXPECT_THAT(out, HasSubstr("round 1: node 0 of 1, ranks 0-1 of 2 (restart 1 of 2)"));
  EXPECT_THAT(out, ::testing::ContainsRegex("\\[rank 0\\] [a-z: ]*resumed from"));
  const auto reference = losses_by_step(dir / "hand" / "metrics.jsonl");
  EXPECT_EQ(losses_by_step(dir / "run" / "metrics.jsonl"), reference);
  EXPECT_EQ(comparable_metrics(dir / "run" / "metrics.jsonl").back(),
            comparable_metrics(dir / "hand" / "metrics.jsonl").back());
}

TEST(Launch, StoppedWorkerIsReportedAsAHangNamingItThenRestarted) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "3",
                              "--monitor-interval", "0.2", "--stop-timeout", "2", "--log-dir", dir.file("logs")},
                             worker_command(config, dir / "run",
                                            {"train.steps=400", "checkpoint.every_steps=20", "checkpoint.resume=auto"}),
                             log);
  ASSERT_FALSE(wait_for_text(log, "step +30/400", 60s).empty()) << read_file(log);
  const auto pids = announced_pids(log, 0);
  ASSERT_EQ(pids.size(), 2u);
  ::kill(pids[1], SIGSTOP);
  const auto report = wait_for_text(log, "hang: .*missing: rank\\(s\\) 1 stopped heartbeating", 3s + 5s);
  EXPECT_FALSE(report.empty()) << "no hang report within hang-timeout + 5 s:\n" << read_file(log);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 120s)) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 0) << out;
  EXPECT_THAT(out, HasSubstr("stuck: rank(s) 0 waiting"));
  EXPECT_THAT(out, ::testing::ContainsRegex("rank 1: step [0-9]+, phase [a-z]+, collective #[0-9]+"));
  EXPECT_THAT(out, HasSubstr("(restart 1 of 1)"));
  EXPECT_TRUE(process_gone(pids[1]));
}

TEST(Launch, AProgramThatNeverHeartbeatsIsNotAHangPastTheTimeout) {
  TempDir dir;
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--hang-timeout", "1", "--monitor-interval",
                              "0.2", "--log-dir", dir.file("logs")},
                             {"/bin/sh", "-c", "sleep 4; echo finished"}, log);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 60s)) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("hang:")));
  EXPECT_THAT(out, HasSubstr("[rank 1] finished"));
  EXPECT_THAT(out, HasSubstr("no worker sent a heartbeat within --hang-timeout 1 s: hang detection watches only "
                             "workers that heartbeat"));
}

TEST(Launch, ExhaustedRestartsEndTheJobWithASummary) {
  TempDir dir;
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                              dir.file("logs")},
                             {"/bin/sh", "-c", "echo \"boom from rank $DTRAIN_RANK round $DTRAIN_RESTART\"; "
                                               "if [ $DTRAIN_RANK = 1 ]; then kill -9 $$; fi; sleep 30"},
                             log);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 60s)) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 1) << out;
  EXPECT_THAT(out, HasSubstr("job failed: 2 failure(s), 1 restart(s) used of --max-restarts 1"));
  EXPECT_THAT(out, ::testing::ContainsRegex("first failure of the last round: rank 1 \\(node 0, host [^,]+, pid "
                                            "[0-9]+\\) failed: signal SIGKILL"));
  EXPECT_THAT(out, HasSubstr("    boom from rank 1 round 1"));
}

TEST(Launch, KilledLauncherLeavesNoWorkerBehind) {
  TempDir dir;
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--log-dir", dir.file("logs")},
                             {"/bin/sleep", "60"}, log);
  ASSERT_FALSE(wait_for_text(log, "rank 1 is pid", 30s).empty()) << read_file(log);
  const auto pids = announced_pids(log, 0);
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) ASSERT_FALSE(process_gone(pid));
  ::kill(launch.pid, SIGKILL);
  std::vector<Spawned> procs{launch};
  wait_all(procs, 10s);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while ((!process_gone(pids[0]) || !process_gone(pids[1])) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  for (pid_t pid : pids) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " survived the launcher";
}

TEST(Launch, SignalIsForwardedAndWorkersSaveBeforeTheLauncherExits) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--log-dir", dir.file("logs")},
                             worker_command(config, dir / "run", {"train.steps=100000"}), log);
  ASSERT_FALSE(wait_for_text(log, "step +10/100000", 60s).empty()) << read_file(log);
  ::kill(launch.pid, SIGTERM);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 60s)) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 128 + SIGTERM) << out;
  EXPECT_THAT(out, HasSubstr("on signal 15: checkpoint saved"));
  EXPECT_THAT(out, HasSubstr("workers saved and exited; exiting as stopped by SIGTERM"));
}

// Ctrl-C at the terminal reaches the launcher (each rank has its own process
// group); it forwards SIGINT, the workers save as for SIGTERM, and the same
// command started again resumes from that checkpoint.
TEST(Launch, CtrlCSavesAndTheSameCommandResumes) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::string log = dir.file("launch.log");
  const std::vector<std::string> args = {"--standalone", "--nproc-per-node", "2", "--log-dir", dir.file("logs")};
  auto launch = start_launch(args, worker_command(config, dir / "run", {"train.steps=100000"}), log);
  ASSERT_FALSE(wait_for_text(log, "step +10/100000", 60s).empty()) << read_file(log);
  ::kill(launch.pid, SIGINT);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 60s)) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 128 + SIGINT) << out;
  EXPECT_THAT(out, HasSubstr("received SIGINT; forwarded to the workers (they save a checkpoint and exit)"));
  EXPECT_THAT(out, HasSubstr("on signal 2: checkpoint saved"));
  EXPECT_THAT(out, HasSubstr("workers saved and exited; exiting as stopped by SIGINT"));

  const std::string again_log = dir.file("again.log");
  auto again = start_launch(args, worker_command(config, dir / "run", {"train.steps=100000"}), again_log);
  ASSERT_FALSE(wait_for_text(again_log, "resumed from .*step_", 60s).empty()) << read_file(again_log);
  ::kill(again.pid, SIGTERM);
  std::vector<Spawned> more{again};
  ASSERT_TRUE(wait_all(more, 60s)) << read_file(again_log);
}

// --peak-flops reaches the workers, whose progress lines then show the MFU.
TEST(Launch, PeakFlopsGivesTheWorkersConsoleTheMfu) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "1", "--peak-flops", "2e9", "--log-dir",
                              dir.file("logs")},
                             worker_command(config, dir / "run", {"train.steps=5"}), log);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 60s)) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 0) << out;
  EXPECT_THAT(out, HasSubstr("MFU over a peak of 2e+09 FLOP/s"));
  EXPECT_THAT(out, ::testing::ContainsRegex("step +5/5 \\|.* [GT]FLOP/s MFU [0-9.]+%"));
}

TEST(Launch, StoreRefusesAWrongTokenAndTheTokenStaysOutOfOutputAndCommandLines) {
  TempDir dir;
  const std::string log = dir.file("launch.log");
  const std::string secret = "s3cret-launch-token";
  auto launch = start_launch({"--standalone", "--nproc-per-node", "1", "--log-dir", dir.file("logs")},
                             {"/bin/sh", "-c", "echo started; sleep 60"}, log, {{"DTRAIN_TOKEN", secret}});
  const auto port = wait_for_text(log, "hosting the run's store on 127.0.0.1:([0-9]+)", 30s);
  ASSERT_EQ(port.size(), 2u) << read_file(log);
  ASSERT_FALSE(wait_for_text(log, "\\[rank 0\\] started", 30s).empty()) << read_file(log);
  comm::TcpStore::Options options;
  options.port = static_cast<std::uint16_t>(std::stoi(port[1]));
  options.connect_timeout = 5s;
  options.token = "wrong";
  EXPECT_THROW(comm::TcpStore{options}, CommError);
  options.token = secret;
  comm::TcpStore right(options);
  right.set("probe", comm::to_bytes("ok"));
  const pid_t worker = announced_pids(log, 0).at(0);
  EXPECT_THAT(read_file(fmt::format("/proc/{}/environ", worker)), HasSubstr("DTRAIN_TOKEN=" + secret));
  EXPECT_THAT(read_file(fmt::format("/proc/{}/cmdline", worker)), Not(HasSubstr(secret)));
  ::kill(launch.pid, SIGTERM);
  std::vector<Spawned> procs{launch};
  ASSERT_TRUE(wait_all(procs, 30s));
  EXPECT_THAT(read_file(log) + read_file(dir / "logs" / "rank_0.log"), Not(HasSubstr(secret)));
}

TEST(Launch, EndpointPortInUseIsAClearError) {
  TempDir dir;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const auto r = run_command(fmt::format("timeout -s KILL 30 {} --nnodes 1 --node-rank 0 --rdzv-endpoint 127.0.0.1:{} "
                                         "--log-dir {} -- /bin/true",
                                         launcher(), port, dir.file("logs")));
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fmt::format("dtrain-launch: error: cannot host the rendezvous store on "
                                              "127.0.0.1:{}: port {} is already in use", port, port)));
}

}  // namespace
}  // namespace dtrain::testing
