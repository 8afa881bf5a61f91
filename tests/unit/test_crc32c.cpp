#include "core/crc32c.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dtrain {
namespace {

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<unsigned char>(i);
    descending[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending.data(), descending.size()), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, ExtendEqualsWhole) {
  const std::string text = "the quick brown fox jumps over the lazy dog, twice over";
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    const std::uint32_t head = crc32c(text.data(), cut);
    EXPECT_EQ(crc32c(text.data() + cut, text.size() - cut, head), crc32c(text.data(), text.size()));
  }
}

TEST(Crc32c, FastPathMatchesTableAtEveryAlignmentAndLength) {
  std::mt19937 rng(7);
  std::vector<unsigned char> bytes(1024 + 16);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (std::size_t start = 0; start < 16; ++start) {
    for (std::size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 1024}) {
      EXPECT_EQ(crc32c(bytes.data() + start, n), crc32c_portable(bytes.data() + start, n))
          << "start " << start << " length " << n;
    }
  }
}

// Long inputs take the three-stream path (blocks of 8 KiB, then 256 bytes)
// whose partial crcs are combined: it must agree with the table everywhere.
TEST(Crc32c, ThreeStreamPathMatchesTableOnLongInputs) {
  std::mt19937 rng(11);
  std::vector<unsigned char> bytes((std::size_t{1} << 20) + 64);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (std::size_t start : {0, 3, 8}) {
    for (std::size_t n : {767, 768, 769, 24575, 24576, 24577, 24576 + 768 + 13, 100000, 1 << 20}) {
      EXPECT_EQ(crc32c(bytes.data() + start, n), crc32c_portable(bytes.data() + start, n))
          << "start " << start << " length " << n;
    }
  }
  EXPECT_EQ(crc32c(bytes.data() + 5000, 60000, crc32c(bytes.data(), 5000)), crc32c(bytes.data(), 65000));
}

}  // namespace
}  // namespace dtrain
