// torchrun's contract in dtrain-launch and dtrain-worker, as real processes:
// a PyTorch program (Debian's python3-torch, init_process_group("gloo",
// init_method="env://")) launched as a .py file all-reduces across both
// ranks, is restarted after a rank is killed with TORCHELASTIC_RESTART_COUNT=1
// and leaves per-rank logs; the same job with torchrun's underscore flags and
// the program as the first positional; dtrain-worker with only torchrun's
// variables set by hand trains what the DTRAIN_* job trains; an unknown
// option before the program is an error and --version prints the version;
// every job has a fresh TORCHELASTIC_RUN_ID and an error file under the log
// folder, and keeps the earlier job's logs; an exception recorded by
// PyTorch's @record reaches the failure summary, and PyTorch's own "[rankN]:"
// prefix is not doubled. Timeouts are upper bounds only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "integration/launch_testing.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string torch_program() { return source_dir() + "/tests/programs/torch_allreduce.py"; }

// The launcher's environment for PyTorch programs: Debian's python3 (with
// python3-torch) first on PATH, and no OMP_NUM_THREADS of the user's (ctest
// sets one; empty counts as unset), so that the launcher sets it as torchrun.
std::map<std::string, std::string> debian_python_first() {
  const char* path = std::getenv("PATH");
  return {{"PATH", std::string("/usr/bin:") + (path != nullptr ? path : "")}, {"OMP_NUM_THREADS", ""}};
}

// Fails the test, saying what to install, when Debian's python3 has no torch.
void require_torch() {
  const CommandResult r = run_command("/usr/bin/python3 -c 'import torch.distributed'");
  ASSERT_EQ(r.exit_code, 0) << "Debian's python3-torch is missing (scripts/setup.sh installs it): " << r.output;
}

// The line each rank prints after the all-reduce, in round `restart`.
std::string allreduce_line(int rank, int restart) {
  return fmt::format("\\[rank {0}\\] rank {0} of 2 local_rank {0} restart {1} run [a-z0-9]+ omp 1 allreduce 3",
                     rank, restart);
}

TEST(LaunchTorchrun, PyTorchDdpScriptAllReducesAndIsRestartedAfterAKill) {
  require_torch();
  TempDir dir;
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                              dir.file("logs")},
                             {torch_program(), "--hold-first-round"}, log, debian_python_first());
  std::vector<Spawned> procs{launch};
  for (int rank : {0, 1}) {
    ASSERT_FALSE(wait_for_text(log, allreduce_line(rank, 0), 120s).empty()) << read_file(log);
  }
  const auto pids = announced_pids(log, 0);
  ASSERT_EQ(pids.size(), 2u) << read_file(log);
  ::kill(pids[1], SIGKILL);
  ASSERT_TRUE(wait_all(procs, 180s)) << read_file(log);
  const std::string out = read_file(log);
  ASSERT_EQ(procs[0].exit_code(), 0) << out;
  EXPECT_THAT(out, HasSubstr("rank 1 failed (signal SIGKILL)"));
  EXPECT_THAT(out, HasSubstr("round 1: node 0 of 1, ranks 0-1 of 2 (restart 1 of 1)"));
  for (int rank : {0, 1}) {
    EXPECT_FALSE(wait_for_text(log, allreduce_line(rank, 1), 1s).empty()) << out;
    const std::string rank_log = read_file(dir / "logs" / fmt::format("rank_{}.log", rank));
    EXPECT_THAT(rank_log, ::testing::ContainsRegex(fmt::format("rank {} of 2 .* restart 0 .*allreduce 3", rank)));
    EXPECT_THAT(rank_log, ::testing::ContainsRegex(fmt::format("rank {} of 2 .* restart 1 .*allreduce 3", rank)));
  }
}

TEST(LaunchTorchrun, TorchrunSpellingsWithTheProgramAsFirstPositional) {
  require_torch();
  TempDir dir;
  const std::string log = dir.file("launch.log");
  std::vector<Spawned> procs{spawn_process({launcher(), "--nproc_per_node", "2", "--rdzv_id", "job7",
                                            "--max_restarts", "0", "--log-dir", dir.file("logs"), torch_program()},
                                           debian_python_first(), log)};
  ASSERT_TRUE(wait_all(procs, 120s)) << read_file(log);
  const std::string out = read_file(log);
  ASSERT_EQ(procs[0].exit_code(), 0) << out;
  EXPECT_THAT(out, HasSubstr("setting OMP_NUM_THREADS=1 for each worker"));
  for (int rank : {0, 1}) {
    EXPECT_THAT(out, HasSubstr(fmt::format("[rank {0}] rank {0} of 2 local_rank {0} restart 0 run job7 omp 1 "
                                           "allreduce 3", rank)));
    EXPECT_TRUE(std::filesystem::exists(dir / "logs" / fmt::format("rank_{}.log", rank)));
  }
}

TEST(LaunchTorchrun, WorkerWithTorchrunVariablesByHandTrainsWhatTheDtrainJobTrains) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  ASSERT_TRUE(run_by_hand(dir, 2, worker_command(config, dir / "hand"))) << read_file(dir / "hand0.log");
  const std::string port = std::to_string(free_port());
  std::vector<Spawned> procs;
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    procs.push_back(spawn_process(worker_command(config, dir / "torchrun"),
                                  {{"RANK", rank}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", rank},
                                   {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}},
                                  dir.file(fmt::format("torchrun{}.log", r))));
  }
  ASSERT_TRUE(wait_all(procs, 120s)) << read_file(dir / "torchrun0.log");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(procs[r].exit_code(), 0) << read_file(dir / fmt::format("torchrun{}.log", r));
  }
  EXPECT_THAT(read_file(dir / "torchrun0.log"), HasSubstr("2 rank(s) (torchrun)"));
  const auto by_torchrun = comparable_metrics(dir / "torchrun" / "metrics.jsonl");
  ASSERT_FALSE(by_torchrun.empty());
  EXPECT_EQ(by_torchrun, comparable_metrics(dir / "hand" / "metrics.jsonl"));
}

TEST(LaunchTorchrun, UnknownOptionBeforeTheProgramIsAnErrorAndVersionPrintsTheVersion) {
  TempDir dir;
  for (const std::string args : {"--master-addr 127.0.0.1 --master-port 29500 --bogus 1 -- true",
                                 "--nproc_per_node 2 --bogus true"}) {
    const CommandResult r = run_command(fmt::format("cd '{}' && '{}' {}", dir.str(), launcher(), args));
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("unknown option '--bogus' before the program: it is not a dtrain-launch option"))
        << args;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "logs")) << "nothing was started";
  const CommandResult version = run_command(launcher() + " --version");
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_THAT(version.output, ::testing::MatchesRegex("dtrain-launch [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

// What one job's worker printed: "run=<TORCHELASTIC_RUN_ID> dtrain=<DTRAIN_RUN_ID> file=<TORCHELASTIC_ERROR_FILE>".
std::vector<std::string> run_and_error_file(const TempDir& dir, const std::string& log,
                                            const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--nproc-per-node", "1", "--tee", "3", "--log-dir", dir.file("logs")};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<Spawned> procs{start_launch(
      args, {"/bin/sh", "-c", "echo \"run=$TORCHELASTIC_RUN_ID dtrain=$DTRAIN_RUN_ID file=$TORCHELASTIC_ERROR_FILE\""},
      log)};
  EXPECT_TRUE(wait_all(procs, 60s)) << read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 0) << read_file(log);
  return wait_for_text(log, "\\[rank 0\\] run=(\\S+) dtrain=(\\S+) file=(\\S+)", 1s);
}

TEST(LaunchTorchrun, EachJobHasAFreshRunIdAnErrorFileInTheLogFolderAndKeepsTheEarlierLogs) {
  TempDir dir;
  const auto first = run_and_error_file(dir, dir.file("first.log"));
  const auto second = run_and_error_file(dir, dir.file("second.log"));
  ASSERT_EQ(first.size(), 4u) << read_file(dir / "first.log");
  ASSERT_EQ(second.size(), 4u) << read_file(dir / "second.log");
  EXPECT_THAT(first[1], ::testing::MatchesRegex("[0-9a-f]{12}"));
  EXPECT_NE(first[1], second[1]) << "two jobs, one run id";
  EXPECT_EQ(first[2], first[1]) << "DTRAIN_RUN_ID and TORCHELASTIC_RUN_ID differ";
  EXPECT_THAT(read_file(dir / "first.log"), HasSubstr(fmt::format("run id {} (fresh for this job", first[1])));
  EXPECT_THAT(read_file(dir / "first.log"), HasSubstr("--tee 3: accepted for torchrun's sake"));
  const auto logs = dir / "logs";
  EXPECT_EQ(first[3], (logs / first[1] / "attempt_0" / "0" / "error.json").string());
  EXPECT_TRUE(std::filesystem::is_directory(std::filesystem::path(second[3]).parent_path()));
  // The first job's log is kept beside the second's.
  EXPECT_THAT(read_file(logs / "rank_0.log"), HasSubstr("run=" + second[1]));
  EXPECT_THAT(read_file(logs / "rank_0.log.1"), HasSubstr("run=" + first[1]));
  EXPECT_THAT(read_file(logs / "rank_0.log"), Not(HasSubstr(first[1])));
  const auto given = run_and_error_file(dir, dir.file("given.log"), {"--rdzv_id", "job9"});
  ASSERT_EQ(given.size(), 4u) << read_file(dir / "given.log");
  EXPECT_EQ(given[1], "job9");
  EXPECT_THAT(read_file(logs / "rank_0.log.2"), HasSubstr("run=" + first[1]));
}

TEST(LaunchTorchrun, RecordedExceptionIsInTheSummaryAndPyTorchsRankPrefixIsNotDoubled) {
  require_torch();
  TempDir dir;
  const std::string log = dir.file("launch.log");
  std::vector<Spawned> procs{spawn_process({launcher(), "--standalone", "--nnodes=1", "--nproc_per_node", "2",
                                            "--rdzv_backend", "c10d", "--log-dir", dir.file("logs"),
                                            source_dir() + "/tests/programs/torch_record_error.py"},
                                           debian_python_first(), log)};
  ASSERT_TRUE(wait_all(procs, 120s)) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 1) << out;
  EXPECT_THAT(out, HasSubstr("dtrain-launch: the workers run python3 from /usr/bin/python3 (the first on PATH)"));
  EXPECT_THAT(out, ::testing::ContainsRegex("\n\\[rank1\\]: started, error file /"));
  EXPECT_THAT(out, Not(HasSubstr("[rank 1] [rank1]:")));
  EXPECT_THAT(out, ::testing::ContainsRegex("first failure of the last round: rank 1 .* failed: exit code 1\n +error "
                                            "file /[^ ]+/attempt_0/1/error.json: ValueError: rank 1 cannot go on: the "
                                            "answer is 42\n"));
  EXPECT_THAT(read_file(dir / "logs" / "rank_1.log"), HasSubstr("[rank1]: started"));
}

}  // namespace
}  // namespace dtrain::testing
