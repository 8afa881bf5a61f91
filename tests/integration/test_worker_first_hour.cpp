// What a new user meets in the first hour with dtrain-worker: Ctrl-C keeps
// the run, a run folder is never a dead end (restart in place, --eval-only),
// the console speaks early and says what runs where, a resume keeps each
// invocation's config and says when the schedule changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>

#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_lm.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

// A small LM on synthetic tokens (about 20 ms a step).
const std::string kQuietLm = quiet_tiny_lm_json(30, 5, 5);

CommandResult worker(const std::filesystem::path& config, const std::string& args) {
  return run_command(fmt::format("{}/dtrain-worker --config {} {}", bin_dir(), config.string(), args));
}

// A worker on the quiet tiny config with `args`, writing to <dir>/run.
CommandResult quiet_run(const TempDir& dir, const std::string& args) {
  return worker(dir.write("tiny.json", kQuietLm), args + " --set train.out_dir=" + (dir / "run").string());
}

// A worker training "forever" into `out`, started in the background (its
// output in `log`), sent `signal` once it logged step `step`: the process,
// reaped (within `timeout`), and its log.
std::pair<Spawned, std::string> stop_worker_at(const std::filesystem::path& config, const std::filesystem::path& out,
                                               const std::string& log, int step, int signal,
                                               std::chrono::seconds timeout) {
  Spawned w = spawn_process({bin_dir() + "/dtrain-worker", "--config", config.string(), "--set",
                             "train.out_dir=" + out.string(), "--set", "train.steps=100000"},
                            {}, log);
  std::vector<Spawned> procs{w};
  if (wait_for_text(log, fmt::format("step +{}/100000", step), 120s).empty()) {
    ADD_FAILURE() << "no step " << step << ":\n" << read_file(log);
  }
  ::kill(w.pid, signal);
  EXPECT_TRUE(wait_all(procs, timeout)) << read_file(log);
  return {procs[0], read_file(log)};
}

// Ctrl-C (SIGINT) saves a checkpoint and exits 0, as SIGTERM does; the run
// started again resumes from it, says that a longer train.steps re-stretches
// the schedule, counts only its own steps and keeps both configs.
TEST(WorkerFirstHour, CtrlCSavesAndTheRunResumes) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kQuietLm);
  const auto out = dir / "run";
  const auto [stopped, first] = stop_worker_at(config, out, dir.file("worker.log"), 10, SIGINT, 120s);
  ASSERT_EQ(stopped.exit_code(), 0) << stopped.outcome() << "\n" << first;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(first, m, std::regex("stopping after step ([0-9]+) on signal 2: checkpoint saved")))
      << first;
  const int saved = std::stoi(m[1]);
  ASSERT_TRUE(std::filesystem::is_directory(out / "checkpoints")) << first;
  EXPECT_FALSE(std::filesystem::is_empty(out / "checkpoints")) << first;

  const CommandResult again =
      worker(config, fmt::format("--set train.out_dir={} --set train.steps={}", out.string(), saved + 10));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr(fmt::format("resumed from")));
  EXPECT_THAT(again.output, HasSubstr(fmt::format("(step {},", saved)));
  EXPECT_THAT(again.output, HasSubstr(fmt::format("done: 10 steps (steps {}-{}, resumed after step {})", saved + 1,
                                                  saved + 10, saved)));
  EXPECT_THAT(again.output, HasSubstr(fmt::format("warning: train.steps is {} but the run saved at step {} had "
                                                  "100000: the cosine schedule now decays over {} steps",
                                                  saved + 10, saved, saved + 10)));
  // The first invocation's config stays as it was; the second has its own file.
  EXPECT_THAT(read_file(out / "config.json"), HasSubstr("\"steps\": 100000"));
  EXPECT_THAT(read_file(out / "config.2.json"), HasSubstr(fmt::format("\"steps\": {}", saved + 10)));
  EXPECT_THAT(again.output, HasSubstr("config " + (out / "config.2.json").string()));
}

// A run killed before its first checkpoint starts again in place (from step
// 0, metrics.jsonl going on); a finished run without checkpoints is still
// never written over.
TEST(WorkerFirstHour, RunFolderWithoutCheckpointRestartsInPlace) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kQuietLm);
  const auto out = dir / "run";
  stop_worker_at(config, out, dir.file("worker.log"), 5, SIGKILL, 30s);  // no save: nothing to resume from
  ASSERT_TRUE(std::filesystem::exists(out / "metrics.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(out / "checkpoints"));

  const std::string run = fmt::format("--set train.out_dir={} --set train.steps=100000", out.string());
  const CommandResult again = worker(config, run + " --set train.steps=10");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("starts again from step 0 in place"));
  EXPECT_THAT(again.output, HasSubstr("done: 10 steps in"));
  EXPECT_THAT(read_file(out / "metrics.jsonl"), HasSubstr(R"({"event":"end","step":10)"));

  // Now finished, with no checkpoint: refused as before.
  const CommandResult finished = worker(config, run + " --set train.steps=10");
  EXPECT_EQ(finished.exit_code, 2) << finished.output;
  EXPECT_THAT(finished.output, HasSubstr("already holds a finished run"));
}

// --eval-only on a run that saved no checkpoint says to set
// checkpoint.every_steps and names the folder, rather than refusing the run
// folder; with a checkpoint it scores it and leaves config.json alone.
TEST(WorkerFirstHour, EvalOnlyNeverRefusesTheRunFolder) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kQuietLm);
  const auto out = dir / "run";
  const std::string run = "--set train.out_dir=" + out.string();
  ASSERT_EQ(worker(config, run + " --set train.steps=5").exit_code, 0);
  const CommandResult none = worker(config, run + " --set train.steps=5 --eval-only");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("checkpoint.every_steps"));
  EXPECT_THAT(none.output, HasSubstr((out / "checkpoints").string()));
  EXPECT_THAT(none.output, Not(HasSubstr("already holds")));

  const auto saved = dir / "saved";
  const std::string with = "--set train.steps=5 --set checkpoint.every_steps=5 --set train.out_dir=" + saved.string();
  ASSERT_EQ(worker(config, with).exit_code, 0);
  const std::string config_json = read_file(saved / "config.json");
  const CommandResult scored = worker(config, with + " --set train.eval_batches=3 --eval-only");
  ASSERT_EQ(scored.exit_code, 0) << scored.output;
  EXPECT_THAT(scored.output, ContainsRegex("eval step 5 \\| loss [0-9.]+"));
  EXPECT_EQ(read_file(saved / "config.json"), config_json);
  EXPECT_FALSE(std::filesystem::exists(saved / "config.2.json"));
}

// The console: a line after the first step (before log_every), the model
// FLOP/s and memory on each step line, MFU once a peak is given, and the
// device, precision and threads at the start.
TEST(WorkerFirstHour, ConsoleSpeaksEarlyAndSaysWhatRunsWhere) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kQuietLm);
  const CommandResult r = worker(config, "--set train.steps=10 --set train.out_dir=" + (dir / "a").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ContainsRegex("step +1/10 \\| loss"));
  EXPECT_THAT(r.output, ContainsRegex("step +5/10 \\| .* [0-9.]+ [GT]FLOP/s \\| RSS [0-9]+ MiB \\| ETA"));
  EXPECT_THAT(r.output,
              ContainsRegex("device cpu, [0-9]+ OpenMP thread\\(s\\) per rank \\(.* wait\\) \\| precision fp32"));
  EXPECT_THAT(r.output, Not(ContainsRegex("MFU [0-9]")));  // no peak, no MFU figure
  EXPECT_THAT(r.output, HasSubstr("done: 10 steps in"));

  const CommandResult peak =
      worker(config, "--peak-flops 1e9 --set train.steps=5 --set train.out_dir=" + (dir / "b").string());
  ASSERT_EQ(peak.exit_code, 0) << peak.output;
  EXPECT_THAT(peak.output, ContainsRegex("FLOP/s MFU [0-9.]+%"));
}

// OpenMP threads wait passively unless the environment chooses (core/openmp_wait.h).
TEST(WorkerFirstHour, OpenMpThreadsWaitPassivelyUnlessTheEnvironmentChooses) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kQuietLm);
  const std::pair<const char*, const char*> cases[] = {
      {"env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_NUM_THREADS=2", "2 OpenMP thread(s) per rank (passive wait)"},
      {"env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active", "(active wait)"},
      {"env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=1000", "(spin count 1000 wait)"}};
  int i = 0;
  for (const auto& [environment, said] : cases) {
    const CommandResult r = run_command(fmt::format("{} {}/dtrain-worker --config {} --set train.steps=1 --set "
                                                    "train.out_dir={}",
                                                    environment, bin_dir(), config.string(),
                                                    (dir / std::to_string(i++)).string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(said)) << environment;
  }
}

// train.steps below schedule.warmup_steps runs, clamped, with a warning.
TEST(WorkerFirstHour, ShortRunClampsTheWarmup) {
  TempDir dir;
  const CommandResult r = quiet_run(dir, "--set train.steps=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("warmup is clamped to 3 steps"));
  EXPECT_THAT(read_file(dir / "run" / "config.json"), HasSubstr("\"warmup_steps\": 3"));
}

// device=cuda --dry-run checks the host's share only: it never says the run
// fits the GPU, and says when there is no GPU to check against.
TEST(WorkerFirstHour, CudaDryRunDoesNotClaimTheGpuFits) {
  TempDir dir;
  const CommandResult r = quiet_run(dir, "--dry-run --set device=cuda");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("the run fits")));
  EXPECT_THAT(r.output, ContainsRegex("needs about [0-9.]+ MiB of GPU memory, not checked against the GPU's: "));
  if (r.output.find("GPU(s) visible here") == std::string::npos) {
    EXPECT_THAT(r.output, HasSubstr("no GPU visible here ("));
    EXPECT_THAT(r.output, HasSubstr("so whether it fits is unknown"));
  }
}

// backend=nccl on a CPU run names the field the user set.
TEST(WorkerFirstHour, NcclOnACpuRunNamesTheBackend) {
  TempDir dir;
  const CommandResult r = quiet_run(dir, "--set parallel.backend=nccl");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("config field 'parallel.backend': nccl moves GPU memory, but device is \"cpu\""));
  EXPECT_THAT(r.output, Not(HasSubstr("field 'device'")));
}

// On a machine with no NVIDIA driver at all, device=cuda says that, not
// that the driver's version is insufficient.
TEST(WorkerFirstHour, NoDriverIsSaidPlainly) {
  if (std::filesystem::exists("/proc/driver/nvidia/version")) GTEST_SKIP() << "this machine has an NVIDIA driver";
  if (!std::filesystem::exists(bin_dir() + "/../lib/libdtrain_cuda.so")) GTEST_SKIP() << "built without CUDA";
  TempDir dir;
  const CommandResult r = quiet_run(dir, "--set device=cuda");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("config field 'device': cuda needs a GPU: no NVIDIA driver was found"));
  EXPECT_THAT(r.output, Not(HasSubstr("insufficient")));
}

}  // namespace
}  // namespace dtrain::testing
