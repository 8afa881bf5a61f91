// Reading gzip'd IDX files (idx_format.h) with zlib. Free functions, any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

struct IdxImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols]
};

// Throw IoError when the file is missing or unreadable (naming it, plus
// `missing_hint`, e.g. the package that installs it), DataError naming the
// file on a wrong magic, a corrupt stream, or fewer bytes than the header says.
IdxImages read_idx_images(const std::string& gz_path, const std::string& missing_hint = "");
std::vector<uint8_t> read_idx_labels(const std::string& gz_path,
                                     const std::string& missing_hint = "");

}  // namespace dtrain::data
