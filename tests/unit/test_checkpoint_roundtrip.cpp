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

// read_ranges (checksums behind the reads) fills exactly what read_range does,
// for ranges read whole and ranges that take part of a record.
TEST(ReadRanges, MatchesReadRangeWhenResharding) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 100, 3);
  const auto dir = step_dir(tmp.path(), 100);
  const Manifest m = read_manifest(env, dir);
  for (int world : {3, 2, 1, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      const std::vector<Range> ranges = layout(world, rank);
      std::vector<std::vector<float>> out;
      for (const Range& r : ranges) out.emplace_back(r.count, -1.0f);
      std::vector<RangeTarget> wanted;
      for (std::size_t i = 0; i < ranges.size(); ++i) wanted.push_back({ranges[i], out[i].data()});
      read_ranges(env, dir, m, wanted);
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        EXPECT_EQ(out[i], expected(100, ranges[i])) << "world " << world << " rank " << rank << " " << i;
      }
    }
  }
}

// A record of several read pieces (12 MiB, read 8 MiB at a time): its crc is
// chained over the pieces, and a flipped byte in the last piece is named.
TEST(ReadRanges, ChecksumsARecordReadInPieces) {
  TempDir tmp;
  Env& env = *default_env();
  const std::int64_t n = std::int64_t{3} << 20;
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>(i % 9973) * 0.5f;
  prepare_step(env, tmp.path(), 1);
  Manifest m;
  m.set_step(1);
  m.set_world_size(1);
  Block* block = m.add_blocks();
  block->set_name("block0");
  block->set_numel(n);
  add_records(write_rank_file(env, pending_dir(tmp.path(), 1), 0, {{{"params", 0, 0, n}, values.data()}}), &m);
  commit_step(env, tmp.path(), m);
  const auto dir = step_dir(tmp.path(), 1);

  std::vector<float> out(values.size(), -1.0f);
  read_ranges(env, dir, m, {{{"params", 0, 0, n}, out.data()}});
  EXPECT_EQ(out, values);

  flip_byte(dir / "rank_00000.bin", kShardDataOffset + static_cast<std::uint64_t>(n) * 4 - 3);
  const std::string what = what_of([&] { read_ranges(env, dir, m, {{{"params", 0, 0, n}, out.data()}}); });
  EXPECT_NE(what.find("rank_00000.bin, tensor params, block 0"), std::string::npos) << what;
  EXPECT_NE(what.find(fmt::format("expected 0x{:08x} found 0x", m.ranges(0).crc32c())), std::string::npos)
      << what;
}

// A mismatch found behind the reads is reported ahead of a later problem the
// reader hits itself (here: a range in no rank file).
TEST(ReadRanges, ReportsTheFirstProblemInReadOrder) {
  TempDir tmp;
  Env& env = *default_env();
  save_step(env, tmp.path(), 100, 1);
  const auto dir = step_dir(tmp.path(), 100);
  Manifest m = read_manifest(env, dir);
  flip_byte(dir / "rank_00000.bin", kShardDataOffset + 1);  // params, block 0
  const Range first = layout(1, 0).front();
  ASSERT_EQ(first.tensor, "params");
  ASSERT_EQ(first.block, 0);
  std::vector<float> a(first.count), b(5);
  const std::string what = what_of([&] {
    read_ranges(env, dir, m, {{first, a.data()}, {{"params", 7, 0, 5}, b.data()}});  // no block 7
  });
  EXPECT_NE(what.find("tensor params, block 0"), std::string::npos) << what;
  EXPECT_NE(what.find("crc32c expected"), std::string::npos) << what;
  // On its own the second range's problem is the gap.
  EXPECT_NE(what_of([&] { read_ranges(env, dir, m, {{{"params", 7, 0, 5}, b.data()}}); }).find("in no rank file"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrain::checkpoint
