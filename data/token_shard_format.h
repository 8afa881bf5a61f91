// The llm.c token shard (.bin), so data prepared for llm.c trains here as-is.
//
// Byte layout, all integers little-endian:
//   offset 0     int32[256] header
//                  header[0] = kTokenShardMagic (20240520)
//                  header[1] = kTokenShardVersion (1: tokens are uint16)
//                  header[2] = token count N (0 <= N <= INT32_MAX)
//                  header[3..255] = 0 (reserved)
//   offset 1024  uint16[N] tokens
// The file is exactly 1024 + 2*N bytes long.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::data {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr std::size_t kTokenShardHeaderInts = 256;
inline constexpr std::size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);
inline constexpr std::size_t kTokenShardTokenBytes = sizeof(uint16_t);

// Indices into the header.
inline constexpr std::size_t kTokenShardMagicField = 0;
inline constexpr std::size_t kTokenShardVersionField = 1;
inline constexpr std::size_t kTokenShardCountField = 2;

}  // namespace dtrain::data
