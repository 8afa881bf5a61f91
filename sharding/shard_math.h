// Shard arithmetic of the data-parallel engine, as pure functions on element
// counts (never bytes). Every block's flat range is padded to a multiple of
// the world size and split evenly: rank r owns elements
// [r * shard, (r + 1) * shard) of the padded block. Checkpoints record the
// same slicing, so they can be resharded onto any world size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

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

// A bucket of consecutive blocks [lo, hi]; its collective starts when block
// lo's backward ends (backward runs hi first).
struct Bucket {
  int lo = 0;
  int hi = 0;
};

struct BucketPlan {
  std::vector<Bucket> buckets;  // in backward order (the head's first)
  std::vector<int> bucket_of;   // block -> index into buckets
};

// The gradient buckets of stages 0-1 on either device, from each block's
// padded element count (f32 bytes): blocks are taken from the last to the
// first, and a bucket closes before a block that would take it past its
// limit (a block larger than the limit gets a bucket of its own). The first
// bucket's limit is parallel.first_bucket_mb (or bucket_mb when smaller),
// every later one's parallel.bucket_mb: as in PyTorch DDP, a small first
// bucket lets the first collective start while most of backward remains.
// The limit of the buckets after the first: parallel.bucket_mb, but no more
// than a kMinBuckets-th of all the gradients (and no less than the first
// bucket's limit), so a model smaller than a few buckets (lm-small's 13 MB
// against PyTorch's 25 MB default) still starts its reduction during backward
// instead of holding one bucket until backward ends.
inline constexpr int kMinBuckets = 4;
inline double bucket_limit_mb(const std::vector<std::int64_t>& padded_numel, double first_bucket_mb,
                              double bucket_mb) {
  double total = 0.0;
  for (const std::int64_t n : padded_numel) total += 4.0 * static_cast<double>(n);
  const double quarter = total / (1024.0 * 1024.0) / kMinBuckets;
  return std::min(bucket_mb, std::max(std::min(first_bucket_mb, bucket_mb), quarter));
}

inline BucketPlan plan_buckets(const std::vector<std::int64_t>& padded_numel, double first_bucket_mb,
                               double bucket_mb) {
  BucketPlan plan;
  const int blocks = static_cast<int>(padded_numel.size());
  plan.bucket_of.assign(padded_numel.size(), 0);
  constexpr double kMiB = 1024.0 * 1024.0;
  double bytes = 0.0;
  for (int b = blocks - 1; b >= 0; --b) {
    const double block_bytes = 4.0 * static_cast<double>(padded_numel[static_cast<std::size_t>(b)]);
    const double limit = (plan.buckets.size() == 1 ? std::min(first_bucket_mb, bucket_mb) : bucket_mb) * kMiB;
    if (plan.buckets.empty() || (bytes > 0.0 && bytes + block_bytes > limit)) {
      plan.buckets.push_back(Bucket{b, b});
      bytes = 0.0;
    }
    plan.buckets.back().lo = b;
    bytes += block_bytes;
    plan.bucket_of[static_cast<std::size_t>(b)] = static_cast<int>(plan.buckets.size()) - 1;
  }
  return plan;
}

}  // namespace dtrain::sharding
