// llm.c token shards: round trip, globbing, and every way a shard can be bad.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/temp_dir.h"
#include "data/token_shard.h"
#include "data/token_shard_format.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

std::vector<uint16_t> iota_tokens(std::size_t n, uint16_t first) {
  std::vector<uint16_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Writes raw bytes: a header with the given fields, then `payload_tokens` uint16s.
void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t count,
                     std::size_t payload_tokens) {
  std::vector<int32_t> header(kTokenShardHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), kTokenShardHeaderBytes);
  const std::vector<uint16_t> tokens(payload_tokens, 7);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(2 * tokens.size()));
}

template <typename E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

TEST(TokenShard, RoundTripKeepsTokensAndLayout) {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  std::vector<uint16_t> tokens = iota_tokens(1000, 65000);  // wraps past 65535: covers high bits
  write_token_shard(path, tokens);
  EXPECT_EQ(fs::file_size(path), kTokenShardHeaderBytes + 2 * tokens.size());
  EXPECT_EQ(read_token_shard(path), tokens);

  // Byte layout: little-endian magic, version and count at the front.
  std::ifstream in(path, std::ios::binary);
  unsigned char head[12];
  in.read(reinterpret_cast<char*>(head), 12);
  EXPECT_EQ(head[0] | head[1] << 8 | head[2] << 16 | head[3] << 24, 20240520);
  EXPECT_EQ(head[4], 1);
  EXPECT_EQ(head[8] | head[9] << 8, 1000);
}

TEST(TokenShard, EmptyShardRoundTrips) {
  TempDir dir;
  write_token_shard(dir.file("e.bin"), {});
  EXPECT_TRUE(read_token_shard(dir.file("e.bin")).empty());
}

TEST(TokenShard, GlobAndDirectoryConcatenateSortedShards) {
  TempDir dir;
  write_token_shard(dir.file("s_01.bin"), iota_tokens(3, 10));
  write_token_shard(dir.file("s_00.bin"), iota_tokens(2, 0));
  write_token_shard(dir.file("other.bin"), iota_tokens(1, 99));
  const std::vector<uint16_t> expected = {0, 1, 10, 11, 12};
  EXPECT_EQ(read_token_shards(dir.file("s_*.bin"), 0), expected);
  EXPECT_EQ(expand_shard_paths(dir.path().string()).size(), 3u);
  EXPECT_EQ(read_token_shards(dir.file("s_00.bin"), 0), (std::vector<uint16_t>{0, 1}));
}

TEST(TokenShard, WrongMagicNamesFoundMagicAndFile) {
  TempDir dir;
  const std::string path = dir.file("bad.bin");
  write_raw_shard(path, 12345, 1, 4, 4);
  const std::string msg = message_of<DataError>([&] { read_token_shard(path); });
  EXPECT_NE(msg.find("found magic 12345, expected 20240520 (llm.c token shard)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST(TokenShard, UnsupportedVersionIsDataError) {
  TempDir dir;
  const std::string path = dir.file("v2.bin");
  write_raw_shard(path, kTokenShardMagic, 2, 4, 4);
  const std::string msg = message_of<DataError>([&] { read_token_shard(path); });
  EXPECT_NE(msg.find("version 2"), std::string::npos) << msg;
}

TEST(TokenShard, TruncatedFileSaysHeaderCountAndHeldCount) {
  TempDir dir;
  const std::string path = dir.file("short.bin");
  write_raw_shard(path, kTokenShardMagic, 1, 100, 60);
  const std::string msg = message_of<DataError>([&] { read_token_shard(path); });
  EXPECT_NE(msg.find("header says 100 tokens, file holds 60"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;

  const std::string tiny = dir.file("tiny.bin");
  std::ofstream(tiny) << "abc";
  EXPECT_THROW(read_token_shard(tiny), DataError);
}

TEST(TokenShard, TrailingBytesAreDataError) {
  TempDir dir;
  const std::string path = dir.file("long.bin");
  write_raw_shard(path, kTokenShardMagic, 1, 10, 11);
  EXPECT_THROW(read_token_shard(path), DataError);
}

TEST(TokenShard, MissingFileNamesPath) {
  TempDir dir;
  const std::string path = dir.file("nope.bin");
  const std::string msg = message_of<IoError>([&] { read_token_shard(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  const std::string glob_msg =
      message_of<IoError>([&] { read_token_shards(dir.file("x_*.bin"), 0); });
  EXPECT_NE(glob_msg.find(dir.file("x_*.bin")), std::string::npos) << glob_msg;
  EXPECT_THROW(read_token_shards(path, 0), IoError);
}

TEST(TokenShard, TokenAtOrAboveVocabNamesFileAndValue) {
  TempDir dir;
  write_token_shard(dir.file("a.bin"), std::vector<uint16_t>{1, 2, 3});
  write_token_shard(dir.file("b.bin"), std::vector<uint16_t>{4, 50257, 5});
  EXPECT_EQ(read_token_shards(dir.file("*.bin"), 50258).size(), 6u);
  const std::string msg =
      message_of<DataError>([&] { read_token_shards(dir.file("*.bin"), 50257); });
  EXPECT_NE(msg.find(dir.file("b.bin")), std::string::npos) << msg;
  EXPECT_NE(msg.find("token 50257 at position 1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dtrain::data
