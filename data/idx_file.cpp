#include "data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <memory>
#include <span>

#include "core/error.h"
#include "data/idx_format.h"

namespace dtrain::data {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

GzFile open_gz(const std::string& path, const std::string& missing_hint) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw IoError(fmt::format("IDX file '{}' does not exist{}", path, missing_hint));
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw_errno("cannot open IDX file", path);
  return GzFile(f);
}

// Reads up to out.size() bytes; returns how many were read (fewer at the end
// of the stream). Throws DataError on a corrupt stream.
std::size_t read_gz(gzFile f, std::span<uint8_t> out, const std::string& path) {
  std::size_t done = 0;
  while (done < out.size()) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(out.size() - done, 1u << 30));
    const int got = gzread(f, out.data() + done, chunk);
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      throw DataError(fmt::format("IDX file '{}' is corrupt: zlib says '{}'; re-download it", path,
                                  msg != nullptr ? msg : "unknown error"));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

uint32_t load_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// Reads the header's `ints` big-endian words and checks the magic.
std::array<uint32_t, 4> read_header(gzFile f, int ints, uint32_t magic, const std::string& path) {
  std::array<uint8_t, 16> raw{};
  const auto bytes = static_cast<std::size_t>(4 * ints);
  const std::size_t got = read_gz(f, std::span<uint8_t>(raw.data(), bytes), path);
  if (got < bytes) {
    throw DataError(fmt::format(
        "IDX file '{}' is truncated: {} bytes, shorter than its {}-byte header", path, got, bytes));
  }
  std::array<uint32_t, 4> words{};
  for (int i = 0; i < ints; ++i) words[i] = load_be32(&raw[4 * i]);
  if (words[0] != magic) {
    throw DataError(
        fmt::format("IDX file '{}': found magic {:#010x}, expected {:#010x}; "
                    "it is not the IDX file its name says",
                    path, words[0], magic));
  }
  return words;
}

void read_payload(gzFile f, std::span<uint8_t> out, const std::string& path,
                  const std::string& what) {
  const std::size_t got = read_gz(f, out, path);
  if (got < out.size()) {
    throw DataError(
        fmt::format("IDX file '{}' is truncated: header says {} ({} bytes), file holds {} "
                    "bytes; re-download it",
                    path, what, out.size(), got));
  }
}

}  // namespace

IdxImages read_idx_images(const std::string& gz_path, const std::string& missing_hint) {
  GzFile f = open_gz(gz_path, missing_hint);
  const auto h = read_header(f.get(), 4, kIdxImagesMagic, gz_path);
  if (h[2] == 0 || h[3] == 0 || h[2] > 1u << 15 || h[3] > 1u << 15 || h[1] > INT32_MAX) {
    throw DataError(
        fmt::format("IDX file '{}': implausible shape {} x {} x {}", gz_path, h[1], h[2], h[3]));
  }
  IdxImages images;
  images.count = h[1];
  images.rows = static_cast<int>(h[2]);
  images.cols = static_cast<int>(h[3]);
  images.pixels.resize(static_cast<std::size_t>(images.count) * h[2] * h[3]);
  read_payload(f.get(), images.pixels, gz_path,
               fmt::format("{} images of {}x{}", images.count, images.rows, images.cols));
  return images;
}

std::vector<uint8_t> read_idx_labels(const std::string& gz_path, const std::string& missing_hint) {
  GzFile f = open_gz(gz_path, missing_hint);
  const auto h = read_header(f.get(), 2, kIdxLabelsMagic, gz_path);
  if (h[1] > INT32_MAX) {
    throw DataError(fmt::format("IDX file '{}': implausible count {}", gz_path, h[1]));
  }
  std::vector<uint8_t> labels(h[1]);
  read_payload(f.get(), labels, gz_path, fmt::format("{} labels", h[1]));
  return labels;
}

}  // namespace dtrain::data
