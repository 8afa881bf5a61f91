// dtrain-worker's memory plan (worker/memory_plan.h), end to end:
//   - `--dry-run` estimates, per rank, within 10% of the peak resident set
//     the real run then reaches, for lm-small and cls-seed at ZeRO stages 0
//     and 3 on 2 ranks (both runs in this test, same machine);
//   - a model too large for the machine is refused before anything large is
//     allocated, with the estimate, the memory available and what to change,
//     and so is its dry run; no std::bad_alloc reaches the user.
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

// DTRAIN_* for rank `rank` of 2 on this node, the store on `port`.
std::string rank_env(int rank, int port) {
  return fmt::format("OMP_NUM_THREADS=1 DTRAIN_RANK={0} DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK={0} "
                     "DTRAIN_LOCAL_WORLD_SIZE=2 DTRAIN_STORE=127.0.0.1:{1} ",
                     rank, port);
}

// The first number after `label` in `text` (MiB figures), or NaN.
double mib_after(const std::string& text, const std::string& label) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(label + R"(\s+([0-9.]+) MiB)"))) return std::nan("");
  return std::stod(m[1].str());
}

class WorkerMemory : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(WorkerMemory, DryRunEstimatesThePeakOfTheRealRunWithinTenPercent) {
  const auto& [name, stage] = GetParam();
  const int port = free_port();
  TempDir dir;
  const std::string worker = fmt::format(
      "{}/dtrain-worker --config {}/examples/configs/{}.json --set parallel.zero_stage={} --set train.steps=3 "
      "--set schedule.warmup_steps=1 --set train.eval_batches=1 --set parallel.timeout_s=120 --set train.out_dir={}",
      bin_dir(), source_dir(), name, stage, (dir.path() / "run").string());
  const CommandResult dry = run_command(rank_env(0, port) + worker + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_THAT(dry.output, HasSubstr("the run fits"));
  const double estimate = mib_after(dry.output, "host total");
  const CommandResult run = run_command(fmt::format("({}{} > {} 2>&1 &) ; {}{}", rank_env(1, port), worker,
                                                   (dir.path() / "rank1.log").string(), rank_env(0, port), worker));
  ASSERT_EQ(run.exit_code, 0) << run.output << "\nrank 1:\n" << read_file(dir.path() / "rank1.log");
  const double peak = mib_after(run.output, "peak RSS");
  ASSERT_FALSE(std::isnan(estimate) || std::isnan(peak)) << dry.output << run.output;
  EXPECT_NEAR(estimate, peak, 0.1 * peak) << name << " stage " << stage << ": dry run\n" << dry.output;
}

INSTANTIATE_TEST_SUITE_P(Configs, WorkerMemory,
                         ::testing::Combine(::testing::Values("lm-small", "cls-seed"), ::testing::Values(0, 3)),
                         [](const auto& info) {
                           return fmt::format("{}_stage{}", std::get<0>(info.param) == "lm-small" ? "lm" : "cls",
                                              std::get<1>(info.param));
                         });

// Activation recompute, one rank of lm-small at micro-batch 64: the dry
// run's estimate is within 10% of the real run's peak in each mode, and the
// peaks fall as the plan says they do (full < selective < none).
TEST(WorkerMemoryRecompute, EachModeFitsItsPlanAndLowersThePeak) {
  TempDir dir;
  std::vector<double> peaks;
  for (const char* mode : {"none", "selective", "full"}) {
    const std::string worker = fmt::format(
        "OMP_NUM_THREADS=1 {}/dtrain-worker --config {}/examples/configs/lm-small.json --set model.recompute={} "
        "--set train.micro_batch_size=64 --set train.steps=2 --set schedule.warmup_steps=1 "
        "--set train.eval_batches=1 --set train.out_dir={}",
        bin_dir(), source_dir(), mode, (dir.path() / mode).string());
    const CommandResult dry = run_command(worker + " --dry-run");
    ASSERT_EQ(dry.exit_code, 0) << dry.output;
    const double estimate = mib_after(dry.output, "host total");
    const CommandResult run = run_command(worker);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const double peak = mib_after(run.output, "peak RSS");
    ASSERT_FALSE(std::isnan(estimate) || std::isnan(peak)) << dry.output << run.output;
    EXPECT_NEAR(estimate, peak, 0.1 * peak) << mode << ": dry run\n" << dry.output;
    peaks.push_back(peak);
  }
  EXPECT_LT(peaks[1], peaks[0]) << "selective against none";
  EXPECT_LT(peaks[2], peaks[1]) << "full against selective";
}

// A run that fits only with recompute is refused with the setting that makes
// it fit (DTRAIN_MEMORY_LIMIT_MB puts the limit between the two plans).
TEST(WorkerMemoryRecompute, ARefusalNamesTheRecomputeThatFits) {
  TempDir dir;
  const std::string worker = fmt::format(
      "{}/dtrain-worker --config {}/examples/configs/lm-small.json --set train.micro_batch_size=64 "
      "--set train.out_dir={} --dry-run",
      bin_dir(), source_dir(), (dir.path() / "run").string());
  const CommandResult none = run_command(worker);
  const CommandResult full = run_command(worker + " --set model.recompute=full");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const double limit = (mib_after(none.output, "host total") + mib_after(full.output, "host total")) / 2;
  const CommandResult refused =
      run_command(fmt::format("DTRAIN_MEMORY_LIMIT_MB={:.0f} {}", limit, worker));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("it fits with model.recompute=\"full\" (activations"));
  const CommandResult bad = run_command("DTRAIN_MEMORY_LIMIT_MB=lots " + worker);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("DTRAIN_MEMORY_LIMIT_MB"));
}

TEST(WorkerMemoryLimit, AModelTooLargeForTheMachineIsRefusedBeforeAllocating) {
  TempDir dir;
  const std::string worker = fmt::format(
      "{}/dtrain-worker --config {}/examples/configs/lm-small.json --set model.d_model=16384 --set model.n_heads=16 "
      "--set model.n_layers=64 --set model.d_ff=65536 --set train.out_dir={}",
      bin_dir(), source_dir(), (dir.path() / "run").string());
  for (const std::string& extra : {std::string(), std::string(" --dry-run")}) {
    const CommandResult r = run_command(worker + extra);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("MiB are available; raise parallel.zero_stage"));
    EXPECT_THAT(r.output, HasSubstr("train.micro_batch_size"));
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("bad_alloc")));
  }
}

}  // namespace
}  // namespace dtrain::testing
