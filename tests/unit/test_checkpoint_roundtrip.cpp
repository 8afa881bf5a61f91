// Save on N ranks, commit, load on M: the write order, the refusals and resharding.
#include <cstring>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/shard_format.h"
#include "checkpoint_fixture.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace {

using namespace testing;

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointNames, StepAndPendingDirs) {
  EXPECT_EQ(step_dir("/r", 200), std::filesystem::path("/r/step_000000200"));
  EXPECT_EQ(pending_dir("/r", 200), std::filesystem::path("/r/.pending_step_000000200"));
  EXPECT_EQ(rank_file_name(3), "rank_00003.bin");
  EXPECT_EQ(parse_step_name("step_000000200"), 200);
  EXPECT_EQ(parse_step_name(".pending_step_000000007"), 7);
  EXPECT_FALSE(parse_step_name("step_12x").has_value());
  EXPECT_FALSE(parse_step_name("latest").has_value());
}

TEST(RankFile, LayoutFollowsShardFormat) {
  TempDir tmp;
  Env& env = *default_env();
  const float a[3] = {1, 2, 3}, b[2] = {4, 5};
  const auto rec =
      write_rank_file(env, tmp.path() / "p", 3, {{{"params", 0, 0, 3}, a}, {{"params", 1, 5, 2}, b}});
  EXPECT_EQ(rec.file, "rank_00003.bin");
  ASSERT_EQ(rec.ranges.size(), 2u);
  EXPECT_EQ(rec.ranges[0].offset, kShardDataOffset);
  EXPECT_EQ(rec.ranges[1].offset, kShardDataOffset + kShardAlignment);
  EXPECT_EQ(rec.size, kShardDataOffset + kShardAlignment + 2 * sizeof(float));
  const std::string bytes = env.read_file(tmp.path() / "p" / rec.file);
  ASSERT_EQ(bytes.size(), rec.size);
  ShardHeader h;
  ASSERT_TRUE(decode_shard_header(reinterpret_cast<const unsigned char*>(bytes.data()), &h));
  EXPECT_EQ(h.version, kShardVersion);
  EXPECT_EQ(h.rank, 3u);
  EXPECT_EQ(h.range_count, 2u);
  float back[2];
  std::memcpy(back, bytes.data() + rec.ranges[1].offset, sizeof back);
  EXPECT_EQ(back[1], 5.0f);
  // Every rank calls it on the same pending dir; a second write of one rank is refused.
  EXPECT_NE(what_of([&] { write_rank_file(env, tmp.path() / "p", 3, {}); }).find("rank_00003.bin"),
            std::string::npos);
  EXPECT_NO_THROW(write_rank_file(env, tmp.path() / "p", 4, {}));
}

TEST(Checkpoint, ThreeRanksReshardToTwoAndOne) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 100, 3);
  std::vector<StepReport> skipped;
  const auto manifest = load_latest(env, tmp.path(), &skipped);
  ASSERT_TRUE(manifest.has_value());
  EXPECT_TRUE(skipped.empty());
  EXPECT_EQ(manifest->step(), 100);
  EXPECT_EQ(manifest->format_version(), kManifestVersion);
  EXPECT_EQ(manifest->files_size(), 3);
  const auto dir = step_dir(tmp.path(), 100);
  for (int world : {3, 2, 1, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      for (const Range& r : layout(world, rank)) {
        EXPECT_EQ(read(env, dir, *manifest, r), expected(100, r))
            << "world " << world << " rank " << rank << " " << r.tensor << " block " << r.block;
      }
    }
  }
  const Range odd{"exp_avg", 0, 1, 9};  // crosses both rank boundaries of the 3-rank save
  EXPECT_EQ(read(env, dir, *manifest, odd), expected(100, odd));
  EXPECT_EQ(read_latest(env, tmp.path()), 100);
  EXPECT_TRUE(verify_step(env, dir).ok) << verify_step(env, dir).problem;
}

TEST(Checkpoint, ReadRangeNamesAGap) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 1, 2);
  const Manifest m = read_manifest(env, step_dir(tmp.path(), 1));
  std::vector<float> out(20);
  const std::string what =
      what_of([&] { read_range(env, step_dir(tmp.path(), 1), m, {"params", 0, 5, 8}, out.data()); });
  EXPECT_NE(what.find("elements [10, 13)"), std::string::npos) << what;
  EXPECT_NE(what.find("params"), std::string::npos) << what;
}

TEST(Checkpoint, CommitRefusesToOverwriteAStep) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 5, 2);
  EXPECT_THROW(prepare_step(env, tmp.path(), 5), IoError);
  // A second commit of the same step (its pending dir rebuilt by hand) is refused too.
  Manifest m = read_manifest(env, step_dir(tmp.path(), 5));
  env.create_directories(pending_dir(tmp.path(), 5));
  const std::string what = what_of([&] { commit_step(env, tmp.path(), m); });
  EXPECT_NE(what.find("step_000000005"), std::string::npos) << what;
  EXPECT_TRUE(verify_step(env, step_dir(tmp.path(), 5)).ok);
}

TEST(Checkpoint, CommitChecksFilesAndCoverage) {
  TempDir tmp;
  Env& env = *default_env();
  Manifest m = write_ranks(env, tmp.path(), 7, 2);
  Manifest wrong_size = m;
  wrong_size.mutable_files(1)->set_size(m.files(1).size() + 4);
  EXPECT_NE(what_of([&] { commit_step(env, tmp.path(), wrong_size); }).find("rank_00001.bin"),
            std::string::npos);
  Manifest gap = m;
  gap.mutable_ranges()->RemoveLast();  // rank 1's last range: exp_avg_sq of block 1
  EXPECT_NE(what_of([&] { commit_step(env, tmp.path(), gap); }).find("exp_avg_sq block 1"),
            std::string::npos);
  env.remove_file(pending_dir(tmp.path(), 7) / "rank_00000.bin");
  EXPECT_NE(what_of([&] { commit_step(env, tmp.path(), m); }).find("missing"), std::string::npos);
  EXPECT_TRUE(committed_steps(env, tmp.path()).empty());
}

TEST(Checkpoint, LatestIsReplacedByRename) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 10, 1);
  EXPECT_EQ(env.read_file(tmp.path() / "latest"), "step_000000010\n");
  save_step(env, tmp.path(), 20, 2);
  EXPECT_EQ(env.read_file(tmp.path() / "latest"), "step_000000020\n");
  EXPECT_FALSE(env.exists(tmp.path() / "latest.tmp"));
  EXPECT_EQ(committed_steps(env, tmp.path()), (std::vector<std::int64_t>{20, 10}));
  EXPECT_EQ(load_latest(env, tmp.path(), nullptr)->step(), 20);
}

}  // namespace
}  // namespace dtrain::checkpoint
