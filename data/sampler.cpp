#include "data/sampler.h"

#include <random>
#include <utility>

#include "core/error.h"
#include "data/hash.h"

namespace dtrain::data {
namespace {

// Uniform in [0, bound] by rejection (no modulo bias), unlike
// std::uniform_int_distribution whose algorithm differs between libraries.
uint64_t draw_at_most(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t range = bound + 1;                // bound < 2^63 here, so no overflow
  const uint64_t threshold = (0 - range) % range;  // 2^64 mod range
  while (true) {
    const uint64_t r = rng();
    if (r >= threshold) return r % range;
  }
}

}  // namespace

void epoch_permutation(uint64_t seed, int64_t epoch, std::span<int64_t> out) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(i);
  std::mt19937_64 rng(hash3(seed, static_cast<uint64_t>(epoch), 0x5eed));
  for (std::size_t i = out.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(draw_at_most(rng, i - 1));
    std::swap(out[i - 1], out[j]);
  }
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<std::size_t>(n));
  epoch_permutation(seed, epoch, perm);
  return perm;
}

Sampler::Sampler(int64_t items, uint64_t seed, bool shuffle)
    : items_(items), seed_(seed), shuffle_(shuffle) {
  DTRAIN_CHECK(items > 0, "a sampler needs at least one item, got {}", items);
  if (shuffle_) perm_.resize(static_cast<std::size_t>(items_));
}

int64_t Sampler::item(int64_t global_sample) {
  DTRAIN_CHECK(global_sample >= 0, "negative global sample {}", global_sample);
  const int64_t within = global_sample % items_;
  if (!shuffle_) return within;
  const int64_t epoch = global_sample / items_;
  if (epoch != cached_epoch_) {
    epoch_permutation(seed_, epoch, perm_);
    cached_epoch_ = epoch;
  }
  return perm_[static_cast<std::size_t>(within)];
}

}  // namespace dtrain::data
