// The byte layout of a rank file, checkpoints/step_NNNNNNNNN/rank_RRRRR.bin,
// and the names of a checkpoint's files. All integers little-endian.
//
//   offset 0   magic        8 bytes "DTCKPT01"
//   offset 8   version      u32, kShardVersion
//   offset 12  rank         u32, the rank that wrote the file
//   offset 16  range count  u64
//   offset 24  zero bytes up to kShardDataOffset
//   then each range's count f32 values, back to back in the order written,
//   each starting at a multiple of kShardAlignment (zero padding between);
//   the file ends with the last range's last byte.
//
// Which range lies where, and each range's crc32c, is recorded only in the
// manifest (proto/checkpoint.proto). No trailer repeats it: a rank file is
// never read without its manifest, whose presence is what commits the step,
// and the manifest's file sizes already detect a cut file. Per-range checksums
// let a resharding reader verify just the ranges it reads. The 64-byte
// alignment keeps every range cache-line aligned when mapped or read with
// O_DIRECT-style buffers.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace dtrain::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "rank files hold raw little-endian f32; a big-endian host would need byte swaps");

inline constexpr std::string_view kShardMagic = "DTCKPT01";
inline constexpr std::uint32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 24;
inline constexpr std::uint64_t kShardAlignment = 64;
inline constexpr std::uint64_t kShardDataOffset = 64;

// Manifest.format_version this code writes and the only one it reads.
inline constexpr std::uint32_t kManifestVersion = 1;

inline constexpr std::string_view kManifestName = "manifest.pb";
inline constexpr std::string_view kManifestTmpName = "manifest.pb.tmp";
inline constexpr std::string_view kLatestName = "latest";
inline constexpr std::string_view kLatestTmpName = "latest.tmp";
inline constexpr std::string_view kStepPrefix = "step_";
inline constexpr std::string_view kPendingPrefix = ".pending_step_";

struct ShardHeader {
  std::uint32_t version = kShardVersion;
  std::uint32_t rank = 0;
  std::uint64_t range_count = 0;
};

inline std::uint64_t align_up(std::uint64_t n) {
  return (n + kShardAlignment - 1) / kShardAlignment * kShardAlignment;
}

inline void encode_shard_header(const ShardHeader& h, unsigned char* out) {
  std::memcpy(out, kShardMagic.data(), kShardMagic.size());
  std::memcpy(out + 8, &h.version, 4);
  std::memcpy(out + 12, &h.rank, 4);
  std::memcpy(out + 16, &h.range_count, 8);
}

// False when the magic is wrong; the caller checks version and rank.
inline bool decode_shard_header(const unsigned char* in, ShardHeader* h) {
  if (std::memcmp(in, kShardMagic.data(), kShardMagic.size()) != 0) return false;
  std::memcpy(&h->version, in + 8, 4);
  std::memcpy(&h->rank, in + 12, 4);
  std::memcpy(&h->range_count, in + 16, 8);
  return true;
}

}  // namespace dtrain::checkpoint
