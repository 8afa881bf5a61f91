// dtrain-bench checkpoint runs end to end on a small model and prints the
// figures scripts read; it leaves nothing behind in --dir.
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain {
namespace {

using testing::bin_dir;
using testing::run_command;
using ::testing::HasSubstr;

TEST(BenchCheckpoint, PrintsSaveLoadAndAsyncFigures) {
  testing::TempDir dir;
  const std::string config = testing::source_dir() + "/examples/configs/lm-small.json";
  const auto r = run_command(fmt::format(
      "OMP_NUM_THREADS=1 {}/dtrain-bench checkpoint --config {} --dir {} --repeats 1 --settle 0 --set model.n_layers=1",
      bin_dir(), config, dir.str()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"save_ratio: ", "load_ratio: ", "async_blocked_fraction: ", "state_gb: ", "command: "}) {
    EXPECT_THAT(r.output, HasSubstr(line));
  }
  EXPECT_THAT(r.output, HasSubstr("--settle 0")) << "the printed command reproduces the run";
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the benchmark removes what it wrote";
}

TEST(BenchCheckpoint, AMissingDirectoryIsAClearError) {
  const auto r = run_command(fmt::format("{}/dtrain-bench checkpoint --config {}/examples/configs/lm-small.json "
                                         "--dir /nonexistent/dtrain-bench",
                                         bin_dir(), testing::source_dir()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("/nonexistent/dtrain-bench"));
}

}  // namespace
}  // namespace dtrain
