// Every binary follows the exit-code table of docs/launcher.md on its command
// line: a usage error (CLI11's own parse errors included) exits 2 with
// "<binary>: error: ..." naming the problem; --help and --version exit 0.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "support/run_command.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

struct Misuse {
  const char* binary;
  const char* args;
  const char* says;  // part of the message
};

TEST(CommandLines, UsageErrorsExitTwoAndSayWhatIsWrong) {
  const Misuse kCases[] = {
      {"dtrain-launch", "--bogus -- true", "unknown option '--bogus' before the program"},
      {"dtrain-launch", "--nproc-per-node many true", "--nproc-per-node 'many' is none of N, auto, cpu or gpu"},
      {"dtrain-worker", "", "--config is required"},
      {"dtrain-worker", "--config x.json --bogus", "--bogus"},
      {"dtrain-bench", "train --config x.json --steps 0", "--steps: must be at least 1, not 0"},
      {"dtrain-bench", "allreduce --iters x", "--iters"},
      {"dtrain-ckpt", "", "A subcommand is required"},
      {"dtrain-ckpt", "verify", "DIR is required"},
      {"dtrain-generate", "--checkpoint d --top-k x", "--top-k"},
  };
  for (const Misuse& m : kCases) {
    const CommandResult r = run_command(fmt::format("'{}/{}' {}", bin_dir(), m.binary, m.args));
    SCOPED_TRACE(fmt::format("{} {}", m.binary, m.args));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr(fmt::format("{}: error: ", m.binary)));
    EXPECT_THAT(r.output, HasSubstr(m.says));
  }
}

TEST(CommandLines, HelpAndVersionExitZero) {
  for (const char* binary : {"dtrain-launch", "dtrain-worker", "dtrain-bench", "dtrain-ckpt", "dtrain-generate"}) {
    SCOPED_TRACE(binary);
    const CommandResult version = run_command(fmt::format("'{}/{}' --version", bin_dir(), binary));
    EXPECT_EQ(version.exit_code, 0) << version.output;
    EXPECT_THAT(version.output, MatchesRegex(fmt::format("{} [0-9]+\\.[0-9]+\\.[0-9]+\n", binary)));
    const CommandResult help = run_command(fmt::format("'{}/{}' --help", bin_dir(), binary));
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_THAT(help.output, HasSubstr("--help"));
  }
}

}  // namespace
}  // namespace dtrain::testing
