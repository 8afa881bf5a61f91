// What resume=auto does with damaged, partial and interrupted steps, and cleanup.
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/fault_env.h"
#include "checkpoint/shard_format.h"
#include "checkpoint_fixture.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace {

using namespace testing;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Recovery, FlippedByteIsNamedAndThePreviousStepUsed) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 100, 3);
  save_step(env, tmp.path(), 200, 3);
  const auto dir = step_dir(tmp.path(), 200);
  const Manifest m = read_manifest(env, dir);
  flip_byte(dir / "rank_00001.bin", kShardDataOffset + 1);  // rank 1's first range
  const StepReport report = verify_step(env, dir);
  EXPECT_FALSE(report.ok);
  EXPECT_TRUE(contains(report.problem, "rank_00001.bin")) << report.problem;
  EXPECT_TRUE(contains(report.problem, "tensor params, block 0")) << report.problem;
  const RangeRecord& bad = m.ranges(static_cast<int>(layout(3, 0).size()));
  ASSERT_EQ(bad.file(), "rank_00001.bin");
  EXPECT_TRUE(contains(report.problem, fmt::format("expected 0x{:08x} found 0x", bad.crc32c())))
      << report.problem;

  std::vector<StepReport> skipped;
  const auto loaded = load_latest(env, tmp.path(), &skipped);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step(), 100);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].step, 200);
  // Reading the damaged range directly fails just as clearly.
  std::vector<float> out(bad.count());
  try {
    read_range(env, dir, m, {bad.tensor(), bad.block(), bad.begin(), bad.count()}, out.data());
    FAIL() << "corrupt range read without error";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "rank_00001.bin, tensor params")) << e.what();
  }
}

TEST(Recovery, TruncatedRankFileIsReportedAndSkipped) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  save_step(env, tmp.path(), 100, 3);
  save_step(env, tmp.path(), 200, 3);
  env.cut_last_write(step_dir(tmp.path(), 200) / "rank_00002.bin", 3);
  std::vector<StepReport> skipped;
  EXPECT_EQ(load_latest(env, tmp.path(), &skipped)->step(), 100);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(contains(skipped[0].problem, "rank_00002.bin: size expected")) << skipped[0].problem;
}

TEST(Recovery, PendingDirWithoutManifestIsIgnored) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 100, 2);
  write_ranks(env, tmp.path(), 200, 2);  // every rank wrote; rank 0 never committed
  std::vector<StepReport> skipped;
  EXPECT_EQ(load_latest(env, tmp.path(), &skipped)->step(), 100);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].dir, pending_dir(tmp.path(), 200));
  EXPECT_TRUE(contains(skipped[0].problem, "never committed")) << skipped[0].problem;
  EXPECT_EQ(committed_steps(env, tmp.path()), (std::vector<std::int64_t>{100}));
  // The next save of that step starts clean.
  save_step(env, tmp.path(), 200, 3);
  EXPECT_EQ(load_latest(env, tmp.path(), nullptr)->step(), 200);
}

TEST(Recovery, CrashBeforeCommitLosesTheStepAfterCommitKeepsIt) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  save_step(env, tmp.path(), 100, 2);
  Manifest m = write_ranks(env, tmp.path(), 200, 2);
  env.fail_nth_rename(2);  // commit: manifest.pb.tmp -> manifest.pb, then pending -> step dir
  EXPECT_THROW(commit_step(env, tmp.path(), m), IoError);
  env.crash();
  std::vector<StepReport> skipped;
  EXPECT_EQ(load_latest(env, tmp.path(), &skipped)->step(), 100);
  EXPECT_EQ(read_latest(env, tmp.path()), 100);

  save_step(env, tmp.path(), 300, 2);
  env.crash();
  const auto loaded = load_latest(env, tmp.path(), &skipped);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step(), 300);
  EXPECT_EQ(read_latest(env, tmp.path()), 300);
  const Range r{"exp_avg_sq", 1, 0, 7};
  EXPECT_EQ(read(env, step_dir(tmp.path(), 300), *loaded, r), expected(300, r));
}

TEST(Recovery, UnsyncedBytesAreLostInACrash) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  save_step(env, tmp.path(), 100, 1);
  // A writer that skipped fsync: the crash leaves a short file, which verify catches.
  const auto dir = step_dir(tmp.path(), 100);
  const std::string bytes = env.read_file(dir / "rank_00000.bin");
  env.remove_file(dir / "rank_00000.bin");
  auto file = env.new_writable_file(dir / "rank_00000.bin");
  file->append(bytes.data(), bytes.size());
  file->close();
  env.sync_dir(dir);
  env.crash();
  EXPECT_EQ(env.file_size(dir / "rank_00000.bin"), 0u);
  EXPECT_FALSE(verify_step(env, dir).ok);
  EXPECT_FALSE(load_latest(env, tmp.path(), nullptr).has_value());
}

TEST(Recovery, FullDiskDuringSaveLeavesThePreviousStep) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  save_step(env, tmp.path(), 100, 2);
  env.fail_nth_write(3);
  EXPECT_THROW(save_step(env, tmp.path(), 200, 2), IoError);
  EXPECT_EQ(load_latest(env, tmp.path(), nullptr)->step(), 100);
  EXPECT_TRUE(verify_step(env, step_dir(tmp.path(), 100)).ok);
}

TEST(Recovery, ManifestOfAnotherVersionIsAClearError) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 100, 1);
  const auto dir = step_dir(tmp.path(), 100);
  Manifest m = read_manifest(env, dir);
  m.set_format_version(kManifestVersion + 1);
  env.remove_file(dir / "manifest.pb");
  env.write_file(dir / "manifest.pb", m.SerializeAsString(), true);
  try {
    read_manifest(env, dir);
    FAIL() << "newer manifest accepted";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "manifest.pb")) << e.what();
    EXPECT_TRUE(contains(e.what(), fmt::format("format version {}", kManifestVersion + 1))) << e.what();
    EXPECT_TRUE(contains(e.what(), "newer dtrain")) << e.what();
  }
  env.remove_file(dir / "manifest.pb");
  env.write_file(dir / "manifest.pb", "\xff\xff garbage", true);
  EXPECT_THROW(read_manifest(env, dir), IoError);
  std::vector<StepReport> skipped;
  EXPECT_FALSE(load_latest(env, tmp.path(), &skipped).has_value());
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(contains(skipped[0].problem, "does not parse")) << skipped[0].problem;
}

TEST(Recovery, RemoveOldStepsKeepsTheNewestAndLatest) {
  TempDir tmp;
  Env& env = *default_env();
  for (int step = 1; step <= 5; ++step) save_step(env, tmp.path(), step, 2);
  env.create_directories(pending_dir(tmp.path(), 2));  // stale: older than the newest step
  env.create_directories(pending_dir(tmp.path(), 6));  // maybe a save in progress
  remove_old_steps(env, tmp.path(), 2);
  EXPECT_EQ(committed_steps(env, tmp.path()), (std::vector<std::int64_t>{5, 4}));
  EXPECT_FALSE(env.exists(pending_dir(tmp.path(), 2)));
  EXPECT_TRUE(env.exists(pending_dir(tmp.path(), 6)));
  EXPECT_FALSE(env.exists(step_dir(tmp.path(), 1)));

  env.remove_file(tmp.path() / "latest");
  env.write_file(tmp.path() / "latest", "step_000000004\n", true);
  save_step(env, tmp.path(), 7, 1);
  env.remove_file(tmp.path() / "latest");
  env.write_file(tmp.path() / "latest", "step_000000004\n", true);
  remove_old_steps(env, tmp.path(), 1);
  EXPECT_EQ(committed_steps(env, tmp.path()), (std::vector<std::int64_t>{7, 4}));
  EXPECT_THROW(remove_old_steps(env, tmp.path(), 0), ConfigError);
}

}  // namespace
}  // namespace dtrain::checkpoint
