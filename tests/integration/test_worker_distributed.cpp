// dtrain-worker as several real processes: with the launcher's variables set
// by hand (gloo, rank 0 hosting the store) and under mpirun (backend auto ->
// mpi). Two ranks x micro-batch 4 must train what one rank with micro-batch
// 8 trains (same per-step losses within 1e-5 relative), rank 0 alone writes
// the run's outputs, and a rank killed with SIGKILL makes the other exit
// with an error instead of hanging.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_lm.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::vector<double> losses(const std::filesystem::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("event")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

void expect_same_losses(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(b[i])) << "step " << i + 1;
}

std::vector<double> one_rank_reference(const TempDir& dir) {
  const auto config = dir.write("tiny.json", kTinyLm);
  const auto r = run_command(fmt::format("{}/dtrain-worker --config {} --set train.micro_batch_size=8 "
                                         "--set train.out_dir={}", bin_dir(), config.string(), dir.file("ref")));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return losses(dir / "ref" / "metrics.jsonl");
}

std::vector<Spawned> start_workers(const TempDir& dir, int world, const std::vector<std::string>& sets) {
  const auto config = dir.write("tiny.json", kTinyLm);
  const std::string store = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Spawned> procs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {bin_dir() + "/dtrain-worker", "--config", config.string(), "--set",
                                     "train.out_dir=" + dir.file("dp")};
    for (const auto& s : sets) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    procs.push_back(spawn_process(argv,
                                  {{"DTRAIN_RANK", std::to_string(r)}, {"DTRAIN_WORLD_SIZE", std::to_string(world)},
                                   {"DTRAIN_STORE", store}, {"DTRAIN_TOKEN", "t"}, {"DTRAIN_RUN_ID", "dp"}},
                                  dir.file("rank" + std::to_string(r) + ".log")));
  }
  return procs;
}

// Waits (up to 60 s) for rank 0's progress line of step 3 (log_every 1): every
// rank is training then. False, with every process killed, when it never comes.
bool training_under_way(std::vector<Spawned>& procs) {
  if (!wait_for_text(procs[0].log_path, "step +3/100000", 60s).empty()) return true;
  wait_all(procs, 0ms);
  return false;
}

TEST(WorkerDistributed, TwoGlooProcessesTrainWhatOneProcessTrainsForEveryStage) {
  for (int stage : {0, 3}) {
    TempDir dir;
    const auto ref = one_rank_reference(dir);
    auto procs = start_workers(dir, 2, {"parallel.zero_stage=" + std::to_string(stage)});
    ASSERT_TRUE(wait_all(procs, 120s)) << "a worker hung";
    for (auto& p : procs) ASSERT_EQ(p.exit_code(), 0) << p.log();
    EXPECT_THAT(procs[0].log(), HasSubstr("2 rank(s) (dtrain-launch), backend gloo, ZeRO stage " + std::to_string(stage)));
    EXPECT_EQ(procs[1].log().find("step "), std::string::npos) << "only rank 0 prints progress";
    expect_same_losses(losses(dir / "dp" / "metrics.jsonl"), ref);
  }
}

TEST(WorkerDistributed, MpirunPicksTheMpiBackendAndTrainsTheSameModel) {
  TempDir dir;
  const auto ref = one_rank_reference(dir);
  const auto config = dir.write("tiny.json", kTinyLm);
  const auto r = run_command(fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -s KILL 120 mpirun -np 2 "
      "{}/dtrain-worker --config {} --set train.out_dir={} --set parallel.zero_stage=1",
      bin_dir(), config.string(), dir.file("dp")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("2 rank(s) (mpirun), backend mpi, ZeRO stage 1"));
  expect_same_losses(losses(dir / "dp" / "metrics.jsonl"), ref);
}

TEST(WorkerDistributed, KilledRankMakesTheOtherExitWithAnError) {
  TempDir dir;
  auto procs = start_workers(dir, 2, {"train.steps=100000", "parallel.zero_stage=2", "parallel.timeout_s=5"});
  ASSERT_TRUE(training_under_way(procs)) << procs[0].log();
  ::kill(procs[1].pid, SIGKILL);
  ASSERT_TRUE(wait_all(procs, 60s)) << "rank 0 hung: " << procs[0].log();
  EXPECT_EQ(procs[0].exit_code(), 2) << procs[0].log();
  EXPECT_THAT(procs[0].log(), HasSubstr("dtrain-worker: error: rank 0: "));
  EXPECT_THAT(procs[0].log(), HasSubstr("rank 1 did not reach"));
}

TEST(WorkerDistributed, SignalToOneRankSavesOnEveryRankThenResumeFinishes) {
  TempDir dir;
  auto procs = start_workers(dir, 2, {"train.steps=100000", "parallel.zero_stage=1",
                                      "checkpoint.dir=" + dir.file("ckpt")});
  ASSERT_TRUE(training_under_way(procs)) << procs[0].log();
  ::kill(procs[1].pid, SIGUSR1);     // as Slurm's --signal would, but to one rank only
  ASSERT_TRUE(wait_all(procs, 60s)) << "a worker hung: " << procs[0].log();
  for (auto& p : procs) EXPECT_EQ(p.exit_code(), 0) << p.log();
  EXPECT_THAT(procs[0].log(), HasSubstr("on signal 10: checkpoint saved"));
  const std::string latest = read_file(dir / "ckpt" / "latest");
  ASSERT_THAT(latest, HasSubstr("step_"));
  const long saved = std::stol(latest.substr(latest.find('_') + 1));
  // Resume on one rank and finish three more steps.
  const auto config = dir / "tiny.json";
  const auto r = run_command(fmt::format(
      "{}/dtrain-worker --config {} --set train.out_dir={} --set checkpoint.dir={} --set checkpoint.resume=auto "
      "--set train.steps={} --set train.micro_batch_size=8",
      bin_dir(), config.string(), dir.file("dp"), dir.file("ckpt"), saved + 3));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fmt::format("resumed from {}", (dir / "ckpt" / fmt::format("step_{:09}", saved)).string())));
  EXPECT_THAT(r.output, HasSubstr("saved by 2 rank(s) at ZeRO stage 1"));
}

}  // namespace
}  // namespace dtrain::testing
