// Text-as-bytes and token-shard datasets through make_datasets: file listing,
// the 10% hold-out, and errors that name the path, package or config field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/temp_dir.h"
#include "data/datasets.h"
#include "data/text_bytes.h"
#include "data/token_shard.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Input tokens of window `w` of `ds`, plus its last target.
std::string window_text(const Dataset& ds, int64_t w) {
  Batch b = make_batch(ds.info(), 1);
  ds.fill(w, b, 0);
  std::string s;
  for (int32_t t : b.tokens) s.push_back(static_cast<char>(t));
  s.push_back(static_cast<char>(b.targets.back()));
  return s;
}

TEST(TextBytes, FolderIsSortedRegularFilesWithoutFortuneIndexes) {
  TempDir dir;
  write_file(dir.file("b"), "world");
  write_file(dir.file("a"), "hello ");
  write_file(dir.file("a.dat"), "INDEX");
  write_file(dir.file("a.u8"), "LINK");
  fs::create_directories(dir.file("sub"));
  write_file(dir.file("sub/c"), "nested");
  const std::vector<uint16_t> bytes = read_text_bytes(dir.str());
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "hello world");
  EXPECT_EQ(list_text_files(dir.file("a")), std::vector<std::string>{dir.file("a")});

  write_file(dir.file("hi"), "\xff\x01");
  const std::vector<uint16_t> high = read_text_bytes(dir.file("hi"));
  EXPECT_EQ(high, (std::vector<uint16_t>{255, 1}));
}

TEST(TextBytes, MissingFortunesSaysWhichPackage) {
  const std::string path = "/usr/share/games/fortunes/no-such-fortune-file";
  try {
    read_text_bytes(path);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("apt-get install fortunes"), std::string::npos)
        << e.what();
  }
  TempDir dir;
  EXPECT_THROW(read_text_bytes(dir.file("missing.txt")), IoError);
  EXPECT_THROW(read_text_bytes(dir.str()), IoError);  // a folder with no text file
}

TEST(TextBytes, RealFortunes) {
  const std::string dir = "/usr/share/games/fortunes";
  // scripts/setup.sh installs the package; its absence is a set-up error.
  ASSERT_TRUE(fs::exists(dir + "/fortunes")) << "fortunes are not installed (apt-get install fortunes)";
  const std::vector<std::string> files = list_text_files(dir);
  for (const std::string& f : files) {
    EXPECT_NE(fs::path(f).extension(), ".dat") << f;
    EXPECT_NE(fs::path(f).extension(), ".u8") << f;
  }
  EXPECT_TRUE(std::is_sorted(files.begin(), files.end()));
  const DatasetPair pair = make_datasets(
      {.kind = "text", .path = dir, .seq_len = 256, .vocab_size = 256, .model_kind = "lm"});
  EXPECT_GT(pair.train->size(), 1000);
  EXPECT_GT(pair.val->size(), 100);
}

TEST(TextDataset, HoldsOutTheLastTenPercentWithoutValPath) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  write_file(dir.file("corpus.txt"), text);
  const DatasetPair pair = make_datasets({.kind = "text",
                                          .path = dir.file("corpus.txt"),
                                          .seq_len = 9,
                                          .vocab_size = 256,
                                          .model_kind = "lm"});
  EXPECT_EQ(pair.train->size(), (900 - 1) / 9);
  EXPECT_EQ(pair.val->size(), (100 - 1) / 9);
  EXPECT_EQ(window_text(*pair.train, 0), text.substr(0, 10));
  EXPECT_EQ(window_text(*pair.train, 3), text.substr(27, 10));
  EXPECT_EQ(window_text(*pair.val, 0), text.substr(900, 10));
  EXPECT_EQ(pair.train->info().vocab_size, 256);
}

TEST(TextDataset, ConfigErrorsNameTheField) {
  TempDir dir;
  write_file(dir.file("small.txt"), std::string(50, 'x'));
  DataSpec spec{.kind = "text",
                .path = dir.file("small.txt"),
                .seq_len = 45,
                .vocab_size = 256,
                .model_kind = "lm"};
  try {
    make_datasets(spec);  // 45 of 50 bytes for training, 5 for validation
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.seq_len");
  }
  spec.seq_len = 4;
  spec.vocab_size = 100;
  try {
    make_datasets(spec);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "model.vocab_size");
  }
  spec.vocab_size = 256;
  spec.path = "";
  try {
    make_datasets(spec);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.path");
  }
}

TEST(TokenDataset, ShardsWithValPathAndVocabCheck) {
  TempDir dir;
  std::vector<uint16_t> train(201), val(41);
  for (std::size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>(i);
  for (std::size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint16_t>(1000 + i);
  write_token_shard(dir.file("train_000.bin"), std::span<const uint16_t>(train).first(101));
  write_token_shard(dir.file("train_001.bin"), std::span<const uint16_t>(train).subspan(101));
  write_token_shard(dir.file("val_000.bin"), val);
  DataSpec spec{.kind = "tokens",
                .path = dir.file("train_*.bin"),
                .val_path = dir.file("val_*.bin"),
                .seq_len = 10,
                .vocab_size = 2000,
                .model_kind = "lm"};
  const DatasetPair pair = make_datasets(spec);
  EXPECT_EQ(pair.train->size(), 20);
  EXPECT_EQ(pair.val->size(), 4);
  Batch b = make_batch(pair.train->info(), 1);
  pair.train->fill(10, b, 0);  // crosses the shard boundary at token 101
  EXPECT_EQ(b.tokens[0], 100);
  EXPECT_EQ(b.targets[9], 110);
  pair.val->fill(1, b, 0);
  EXPECT_EQ(b.tokens[0], 1010);

  spec.vocab_size = 1040;  // val holds tokens up to 1040
  try {
    make_datasets(spec);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("val_000.bin")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token 1040"), std::string::npos) << e.what();
  }

  // Without val_path: the last 10% of the tokens.
  spec.vocab_size = 2000;
  spec.val_path = "";
  const DatasetPair held = make_datasets(spec);
  EXPECT_EQ(held.train->size(), (181 - 1) / 10);
  EXPECT_EQ(held.val->size(), (20 - 1) / 10);
  held.val->fill(0, b, 0);
  EXPECT_EQ(b.tokens[0], 181);

  spec.path = dir.file("nothing_*.bin");
  EXPECT_THROW(make_datasets(spec), IoError);
}

}  // namespace
}  // namespace dtrain::data
