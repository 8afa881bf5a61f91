// Fashion-MNIST: gzip'd IDX parsing on files written here with zlib, patch
// order and normalization, errors, and the real Debian dataset when present.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/temp_dir.h"
#include "data/datasets.h"
#include "data/fashion_mnist.h"
#include "data/idx_file.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Image n's pixel (y, x) is a value that identifies n, y and x.
uint8_t pixel(int n, int y, int x) { return static_cast<uint8_t>((n * 37 + y * 28 + x) % 256); }

// Writes {split}-images/labels files with `count` 28x28 images; the images
// file claims `claimed` images (to make it truncated) and has magic `magic`.
void write_split(const TempDir& dir, const std::string& split, int count, int claimed = -1,
                 uint32_t magic = 0x00000803) {
  std::vector<uint8_t> images;
  put_be32(images, magic);
  put_be32(images, static_cast<uint32_t>(claimed < 0 ? count : claimed));
  put_be32(images, 28);
  put_be32(images, 28);
  for (int n = 0; n < count; ++n) {
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) images.push_back(pixel(n, y, x));
    }
  }
  write_gz(dir.file(split + "-images-idx3-ubyte.gz"), images);
  std::vector<uint8_t> labels;
  put_be32(labels, 0x00000801);
  put_be32(labels, static_cast<uint32_t>(count));
  for (int n = 0; n < count; ++n) labels.push_back(static_cast<uint8_t>((n * 3) % 10));
  write_gz(dir.file(split + "-labels-idx1-ubyte.gz"), labels);
}

float normalized(uint8_t byte) { return (byte / 255.0f - 0.2860f) / 0.3530f; }

TEST(FashionMnist, ParsesIdxAndCutsRowMajorPatches) {
  TempDir dir;
  write_split(dir, "train", 5);
  write_split(dir, "t10k", 2);
  const IdxImages images = read_idx_images(dir.file("train-images-idx3-ubyte.gz"));
  EXPECT_EQ(images.count, 5);
  EXPECT_EQ(images.rows, 28);
  EXPECT_EQ(images.pixels[2 * 784 + 5 * 28 + 9], pixel(2, 5, 9));

  const DatasetPair pair = make_datasets({.kind = "fashion_mnist",
                                          .path = dir.str(),
                                          .num_classes = 10,
                                          .patch_size = 7,
                                          .model_kind = "classifier"});
  EXPECT_EQ(pair.train->size(), 5);
  EXPECT_EQ(pair.val->size(), 2);
  const DatasetInfo& info = pair.train->info();
  EXPECT_EQ(info.seq_len, 16);  // (28/7)^2 patches
  EXPECT_EQ(info.input, Input::kPatches);
  EXPECT_EQ(info.task, Task::kClassification);

  Batch b = make_batch(info, 2);
  EXPECT_EQ(b.patch_dim, 49);
  EXPECT_EQ(b.patches.size(), 2u * 16 * 49);
  pair.train->fill(3, b, 1);
  EXPECT_EQ(b.targets[1], 9);  // label of image 3: 3*3 % 10
  const float* row = b.patches.data() + 16 * 49;
  // Patch 6 is patch row 1, patch column 2: pixels y in [7,14), x in [14,21).
  for (int yy = 0; yy < 7; ++yy) {
    for (int xx = 0; xx < 7; ++xx) {
      EXPECT_FLOAT_EQ(row[6 * 49 + yy * 7 + xx], normalized(pixel(3, 7 + yy, 14 + xx)));
    }
  }
  EXPECT_FLOAT_EQ(row[15 * 49 + 48], normalized(pixel(3, 27, 27)));  // last pixel of last patch
  EXPECT_FLOAT_EQ(normalized(0), -0.2860f / 0.3530f);
}

TEST(FashionMnist, WrongMagicAndTruncationNameTheFile) {
  TempDir dir;
  write_split(dir, "train", 3, /*claimed=*/4);
  const std::string images = dir.file("train-images-idx3-ubyte.gz");
  try {
    read_idx_images(images);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(images), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  write_split(dir, "train", 3, -1, /*magic=*/0x00000801);
  try {
    read_idx_images(images);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("found magic 0x00000801"), std::string::npos) << e.what();
  }
  // A labels file read as images fails on the magic too.
  EXPECT_THROW(read_idx_images(dir.file("train-labels-idx1-ubyte.gz")), DataError);
}

TEST(FashionMnist, MismatchedCountsAndBadLabelsAreDataErrors) {
  IdxImages images{.count = 2, .rows = 28, .cols = 28, .pixels = std::vector<uint8_t>(2 * 784)};
  EXPECT_THROW(FashionMnistDataset(images, {1, 2, 3}, 7, "x"), DataError);
  EXPECT_THROW(FashionMnistDataset(images, {1, 10}, 7, "x"), DataError);
  EXPECT_THROW(FashionMnistDataset(images, {1, 2}, 6, "x"), ConfigError);
  EXPECT_EQ(FashionMnistDataset(images, {1, 2}, 28, "x").info().seq_len, 1);
}

TEST(FashionMnist, MissingDirectoryNamesPathAndPackage) {
  TempDir dir;
  const std::string missing = dir.file("fashion");
  try {
    make_datasets({.kind = "fashion_mnist",
                   .path = missing,
                   .num_classes = 10,
                   .patch_size = 4,
                   .model_kind = "classifier"});
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  }
}

TEST(FashionMnist, RealDebianDataset) {
  // scripts/setup.sh installs the package; its absence is a set-up error.
  ASSERT_TRUE(fs::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
      << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const DatasetPair pair = make_datasets(
      {.kind = "fashion_mnist", .num_classes = 10, .patch_size = 4, .model_kind = "classifier"});
  ASSERT_EQ(pair.train->size(), 60000);
  ASSERT_EQ(pair.val->size(), 10000);
  const auto& train = dynamic_cast<const FashionMnistDataset&>(*pair.train);
  std::vector<int> per_class(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) per_class[train.label(i)]++;
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << "class " << c;
  Batch b = make_batch(pair.val->info(), 8);
  for (int r = 0; r < 8; ++r) pair.val->fill(9992 + r, b, r);
  for (int r = 0; r < 8; ++r) {
    EXPECT_GE(b.targets[r], 0);
    EXPECT_LT(b.targets[r], 10);
  }
  for (float v : b.patches) {
    ASSERT_GE(v, normalized(0) - 1e-6f);
    ASSERT_LE(v, normalized(255) + 1e-6f);
  }
}

}  // namespace
}  // namespace dtrain::data
