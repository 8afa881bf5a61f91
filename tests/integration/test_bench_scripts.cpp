// Every bench/*.sh script run at its smallest settings, so that none stops
// working unnoticed: each must exit 0 and print the figure lines it exists
// for. The figures themselves are not checked (this machine is shared). The
// scripts that compare against PyTorch are skipped, saying why, when no
// PyTorch is installed (Debian's python3-torch or scripts/setup-torch.sh's
// .venv-torch), and the GPU one without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_lm.h"

namespace dtrain::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string build_dir() { return std::filesystem::path(bin_dir()).parent_path().string(); }

// bench/SCRIPT with `env` (NAME=value ...) and `args`, killed after
// `timeout_s`; its exit code and output (stderr too).
CommandResult run_bench(const std::string& script, const std::string& env, const std::string& args,
                        int timeout_s = 300) {
  return run_command(fmt::format("cd {0} && env BUILD_DIR={1} {2} timeout -s KILL {3} bash bench/{4} {5} 2>&1",
                                 source_dir(), build_dir(), env, timeout_s, script, args));
}

// A config that trains in milliseconds.
std::string tiny_lm(const TempDir& dir) {
  return dir.write("tiny.json", quiet_tiny_lm_json(20, 2, 1)).string();
}

// The PEERS value that reaches an installed PyTorch without installing one
// ("debian" or "pypi"), or "" when there is none.
std::string installed_torch_peer() {
  // Debian's python3-torch lives under /usr/bin/python3 (python3 on PATH may be another interpreter).
  if (run_command("timeout 60 /usr/bin/python3 -c 'import torch' 2>&1").exit_code == 0) return "debian";
  const std::string venv = source_dir() + "/.venv-torch/bin/python";
  if (std::filesystem::exists(venv) && run_command("timeout 60 " + venv + " -c 'import torch' 2>&1").exit_code == 0) {
    return "pypi";
  }
  return "";
}

TEST(BenchScripts, LaunchTimesKillsARankAndTimesTheResume) {
  TempDir dir;
  // Rank 0 sleeps 200 ms a step, so the job is still running when step 6 is seen.
  const CommandResult r =
      run_bench("launch-times.sh",
                fmt::format("CONFIG={} STEPS=12 KILL_AT=6 NPROC=2 WORKER_ARGS='--testonly-slow-rank 0:200'",
                            tiny_lm(dir)),
                build_dir(), 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 killed after step 6, resumed at step 6"));
  for (const char* figure : {"launch_to_first_step_s", "death_to_resumed_s", "launch_to_workers_started_s",
                             "death_to_workers_restarted_s"}) {
    EXPECT_THAT(r.output, ContainsRegex(fmt::format("{}: [0-9]+\\.[0-9]+", figure))) << r.output;
  }
}

TEST(BenchScripts, CompareCollectivesFindsNothingWrong) {
  const CommandResult r =
      run_bench("compare-collectives.sh", "ROUNDS=1 SWEEP_ITERS=1 SWEEP_MAX_BYTES=64K SKIP_BUILD=1", "", 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("building")));
  for (const char* figure : {"mpi_16M_ratio", "mpi_64M_ratio", "gloo_16M_ratio", "gloo_64M_ratio"}) {
    EXPECT_THAT(r.output, ContainsRegex(fmt::format("{}: [0-9]+\\.[0-9]+", figure))) << r.output;
  }
  EXPECT_THAT(r.output, HasSubstr("wrong_total: 0"));
}

TEST(BenchScripts, CompareCollectivesSaysWhatIsMissing) {
  TempDir dir;
  const CommandResult r = run_command(fmt::format("cd {} && env BUILD_DIR={} SKIP_BUILD=1 timeout -s KILL 60 bash "
                                                  "bench/compare-collectives.sh 2>&1",
                                                  source_dir(), dir.file("no-build")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("dtrain-bench is missing: build it"));
}

TEST(BenchScripts, CompareBuildsComparesABuildWithItself) {
  const std::string bench = bin_dir() + "/dtrain-bench";
  const CommandResult r =
      run_bench("compare-builds.sh", "REPEATS=1 STEPS=2 CONFIGS=lm-small PRECISIONS=fp32", bench + " " + bench);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ContainsRegex("lm-small +fp32 +old +[0-9.]+ +new +[0-9.]+ +new/old [0-9.]+")) << r.output;
}

TEST(BenchScripts, GenerateSpeedTimesBothDecoders) {
  const CommandResult r = run_bench("generate-speed.sh", "NEW=8", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* figure : {"tokens_per_s_cached", "tokens_per_s_recompute", "cache_speedup"}) {
    EXPECT_THAT(r.output, ContainsRegex(fmt::format("{}: [0-9]+(\\.[0-9]+)?", figure))) << r.output;
  }
}

TEST(BenchScripts, MemoryZeroMeasuresEveryStage) {
  TempDir dir;
  const CommandResult r = run_bench("memory-zero.sh", "WORLDS=2 STAGES='0 3' BACKEND=gloo", tiny_lm(dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* figure : {"stage0_world2_ratio", "stage3_world2_ratio"}) {
    EXPECT_THAT(r.output, ContainsRegex(fmt::format("{}: [0-9]+\\.[0-9]+", figure))) << r.output;
  }
}

TEST(BenchScripts, RecomputeMeasuresEveryMode) {
  TempDir dir;
  const CommandResult r =
      run_bench("recompute.sh", fmt::format("CONFIG={} MICRO_BATCH=2 SEQ=16 STEPS=1 REPEATS=1", tiny_lm(dir)), "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* mode : {"none", "selective", "full"}) {
    EXPECT_THAT(r.output, ContainsRegex(fmt::format("{} +[0-9.]+ +[0-9.]+x +[0-9.]+ +[0-9.]+x", mode))) << r.output;
  }
}

TEST(BenchScripts, OnnxExportTimesTheExport) {
  TempDir dir;
  const CommandResult r = run_bench("onnx-export.sh", fmt::format("CONFIG={} REPEATS=1", tiny_lm(dir)), build_dir());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* figure : {"export_s", "peak_rss_mb", "model_mb"}) {
    EXPECT_THAT(r.output, ContainsRegex(fmt::format("{}: [0-9]+\\.[0-9]+", figure))) << r.output;
  }
}

TEST(BenchScripts, OnnxLatencyRunsBothModels) {
  ASSERT_TRUE(std::filesystem::exists(venv_python()))
      << venv_python() << " is missing: run scripts/setup.sh (it installs ONNX Runtime into .venv/)";
  TempDir dir;
  const CommandResult r = run_bench("onnx-latency.sh", fmt::format("CONFIG={} BATCH=2 RUNS=2", tiny_lm(dir)),
                                    build_dir());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* figure : {"f32_ms", "int8_ms", "int8_speedup"}) {
    EXPECT_THAT(r.output, ContainsRegex(fmt::format("{}: [0-9]+\\.[0-9]+", figure))) << r.output;
  }
}

TEST(BenchScripts, ComparePytorchAgainstAnInstalledTorch) {
  const std::string peer = installed_torch_peer();
  ASSERT_FALSE(peer.empty()) << "no PyTorch installed: run scripts/setup.sh (it installs Debian's "
                                "python3-torch), which compare-pytorch.sh compares against";
  const CommandResult r =
      run_bench("compare-pytorch.sh", fmt::format("STEPS=2 PRECISIONS=fp32 PEERS={}", peer), "lm-small", 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("dtrain_tokens/s")) << r.output;
}

TEST(BenchScripts, CompareDdpAgainstAnInstalledTorch) {
  const std::string peer = installed_torch_peer();
  ASSERT_FALSE(peer.empty()) << "no PyTorch installed: run scripts/setup.sh (it installs Debian's "
                                "python3-torch), which compare-ddp.sh compares against";
  const CommandResult r = run_bench(
      "compare-ddp.sh", fmt::format("STEPS=2 WARMUP=1 STAGES=0 BACKENDS=gloo PEERS={}", peer), "lm-small", 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("vs_ddp")) << r.output;
}

TEST(BenchScripts, ComparePytorchGpuOnAGpu) {
  if (run_command("timeout 30 nvidia-smi -L 2>&1").exit_code != 0) GTEST_SKIP() << "no GPU (nvidia-smi -L fails)";
  const std::string peer = installed_torch_peer();
  if (peer.empty()) GTEST_SKIP() << "no PyTorch installed (scripts/setup-torch.sh installs one into .venv-torch)";
  const std::string python = peer == "debian" ? "python3" : source_dir() + "/.venv-torch/bin/python";
  const CommandResult r = run_bench(
      "compare-pytorch-gpu.sh",
      fmt::format("REPEATS=1 STEPS=2 CONFIGS=lm-small PRECISIONS=fp32 MODES=eager PYTHON={}", python),
      bin_dir() + "/dtrain-bench", 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("dtrain/best")) << r.output;
}

}  // namespace
}  // namespace dtrain::testing
