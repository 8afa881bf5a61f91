#include "data/token_shard.h"

#include <glob.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "data/token_shard_format.h"

namespace dtrain::data {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_file(const std::string& path, const char* mode) {
  std::FILE* f = std::fopen(path.c_str(), mode);
  if (f == nullptr) {
    if (errno == ENOENT) {
      throw IoError(
          fmt::format("token shard '{}' does not exist; check data.path / data.val_path", path));
    }
    throw_errno("cannot open token shard", path);
  }
  return File(f);
}

int32_t load_le32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                              uint32_t{p[3]} << 24);
}

void store_le32(unsigned char* p, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(u >> (8 * i));
}

void swap_if_big_endian(std::span<uint16_t> tokens) {
  if constexpr (std::endian::native == std::endian::big) {
    for (uint16_t& t : tokens) t = static_cast<uint16_t>((t >> 8) | (t << 8));
  }
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

}  // namespace

void append_token_shard(const std::string& path, std::vector<uint16_t>& out) {
  File f = open_file(path, "rb");
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(path, ec);
  if (ec) throw IoError(fmt::format("cannot stat token shard '{}': {}", path, ec.message()));

  std::array<unsigned char, kTokenShardHeaderBytes> header{};
  if (file_bytes < kTokenShardHeaderBytes ||
      std::fread(header.data(), 1, header.size(), f.get()) != header.size()) {
    throw DataError(fmt::format(
        "token shard '{}' is truncated: {} bytes, shorter than the {}-byte llm.c header; "
        "re-create the shard",
        path, file_bytes, kTokenShardHeaderBytes));
  }
  const int32_t magic = load_le32(&header[4 * kTokenShardMagicField]);
  if (magic != kTokenShardMagic) {
    throw DataError(
        fmt::format("token shard '{}': found magic {}, expected {} (llm.c token shard); "
                    "the file is not a token shard",
                    path, magic, kTokenShardMagic));
  }
  const int32_t version = load_le32(&header[4 * kTokenShardVersionField]);
  if (version != kTokenShardVersion) {
    throw DataError(fmt::format(
        "token shard '{}': version {} is not supported (only version {}, uint16 tokens); "
        "re-export the data with uint16 tokens",
        path, version, kTokenShardVersion));
  }
  const int32_t count = load_le32(&header[4 * kTokenShardCountField]);
  const uint64_t held = (file_bytes - kTokenShardHeaderBytes) / kTokenShardTokenBytes;
  const uint64_t expected_bytes =
      kTokenShardHeaderBytes + static_cast<uint64_t>(std::max(count, 0)) * kTokenShardTokenBytes;
  if (count < 0 || held < static_cast<uint64_t>(count)) {
    throw DataError(fmt::format(
        "token shard '{}' is truncated: header says {} tokens, file holds {}; re-create the shard",
        path, count, held));
  }
  if (file_bytes != expected_bytes) {
    throw DataError(
        fmt::format("token shard '{}': header says {} tokens ({} bytes) but the file has {} bytes; "
                    "the shard is corrupt, re-create it",
                    path, count, expected_bytes, file_bytes));
  }
  const std::size_t old_size = out.size();
  out.resize(old_size + static_cast<std::size_t>(count));
  const std::size_t got = count == 0 ? 0
                                     : std::fread(out.data() + old_size, kTokenShardTokenBytes,
                                                  static_cast<std::size_t>(count), f.get());
  if (got != static_cast<std::size_t>(count)) {
    out.resize(old_size);
    if (std::ferror(f.get())) throw_errno("cannot read token shard", path);
    throw DataError(fmt::format(
        "token shard '{}' is truncated: header says {} tokens, file holds {}; re-create the shard",
        path, count, got));
  }
  swap_if_big_endian(std::span<uint16_t>(out).subspan(old_size));
}

std::vector<uint16_t> read_token_shard(const std::string& path) {
  std::vector<uint16_t> tokens;
  append_token_shard(path, tokens);
  return tokens;
}

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {
    throw DataError(
        fmt::format("cannot write {} tokens to '{}': an llm.c shard holds at most {}; "
                    "split the data into several shards",
                    tokens.size(), path, INT32_MAX));
  }
  std::array<unsigned char, kTokenShardHeaderBytes> header{};
  store_le32(&header[4 * kTokenShardMagicField], kTokenShardMagic);
  store_le32(&header[4 * kTokenShardVersionField], kTokenShardVersion);
  store_le32(&header[4 * kTokenShardCountField], static_cast<int32_t>(tokens.size()));

  std::FILE* raw = std::fopen(path.c_str(), "wb");
  if (raw == nullptr) throw_errno("cannot create token shard", path);
  File f(raw);
  bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
  if constexpr (std::endian::native == std::endian::little) {
    ok = ok && (tokens.empty() ||  // fwrite's pointer must not be null, even for 0 items
                std::fwrite(tokens.data(), kTokenShardTokenBytes, tokens.size(), f.get()) ==
                    tokens.size());
  } else {
    for (uint16_t t : tokens) {
      const unsigned char le[2] = {static_cast<unsigned char>(t),
                                   static_cast<unsigned char>(t >> 8)};
      ok = ok && std::fwrite(le, 1, 2, f.get()) == 2;
    }
  }
  if (!ok) throw_errno("cannot write token shard", path);
  if (std::fclose(f.release()) != 0) throw_errno("cannot close token shard", path);
}

std::vector<std::string> expand_shard_paths(const std::string& pattern) {
  std::error_code ec;
  if (std::filesystem::is_directory(pattern, ec)) {
    return expand_shard_paths((std::filesystem::path(pattern) / "*.bin").string());
  }
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    if (!has_glob_chars(pattern)) {
      throw IoError(
          fmt::format("token shard '{}' does not exist; check data.path / data.val_path", pattern));
    }
    throw IoError(
        fmt::format("no token shard matches '{}'; check data.path / data.val_path", pattern));
  }
  if (rc != 0) {
    throw IoError(
        fmt::format("cannot expand token shard pattern '{}' (glob error {})", pattern, rc));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

void check_token_range(std::span<const uint16_t> tokens, int vocab_size, const std::string& file) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      throw DataError(
          fmt::format("token shard '{}': token {} at position {} is >= model.vocab_size {}; "
                      "raise model.vocab_size or re-tokenize the data",
                      file, tokens[i], i, vocab_size));
    }
  }
}

std::vector<uint16_t> read_token_shards(const std::string& pattern, int vocab_size) {
  std::vector<uint16_t> stream;
  for (const std::string& path : expand_shard_paths(pattern)) {
    const std::size_t begin = stream.size();
    append_token_shard(path, stream);
    if (vocab_size > 0) {
      check_token_range(std::span<const uint16_t>(stream).subspan(begin), vocab_size, path);
    }
  }
  return stream;
}

}  // namespace dtrain::data
