// Shard arithmetic of the data-parallel engine, as pure functions on element
// counts (never bytes). Every block's flat range is padded to a multiple of
// the world size and split evenly: rank r owns elements
// [r * shard, (r + 1) * shard) of the padded block. Checkpoints record the
// same slicing, so they can be resharded onto any world size.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dtrain::sharding {

struct Range {
  std::int64_t offset = 0;
  std::int64_t size = 0;
  constexpr std::int64_t end() const { return offset + size; }
};

// Elements each rank owns of a block of `numel` elements: ceil(numel / world).
constexpr std::int64_t shard_size(std::int64_t numel, int world) {
  return (numel + world - 1) / world;
}

// The block padded to a multiple of the world size.
constexpr std::int64_t padded_size(std::int64_t numel, int world) {
  return shard_size(numel, world) * world;
}

// Rank r's slice of the padded block.
constexpr Range shard_range(std::int64_t numel, int world, int rank) {
  const std::int64_t s = shard_size(numel, world);
  return Range{s * rank, s};
}

// The part of rank r's slice that holds real elements (the rest is padding);
// size 0 when the whole slice is padding.
constexpr Range owned_elements(std::int64_t numel, int world, int rank) {
  const Range r = shard_range(numel, world, rank);
  const std::int64_t end = std::min(r.end(), numel);
  return Range{std::min(r.offset, numel), std::max<std::int64_t>(0, end - r.offset)};
}

// The overlap of two ranges (size 0 when they do not meet).
constexpr Range intersect(Range a, Range b) {
  const std::int64_t lo = std::max(a.offset, b.offset);
  const std::int64_t hi = std::min(a.end(), b.end());
  return Range{lo, std::max<std::int64_t>(0, hi - lo)};
}

}  // namespace dtrain::sharding
