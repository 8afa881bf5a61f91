// Stateless integer mixing for seeded, random-access data: any sample or
// permutation is a pure function of (seed, indices), so it can be recomputed
// on any rank, at any position, after a restart, with the same result.
#pragma once

#include <cstdint>

namespace dtrain::data {

// SplitMix64's finalizer: a bijection on 64-bit values with good avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A hash of a seed and up to two indices; distinct argument tuples give
// (practically) independent values.
constexpr uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b = 0) {
  return mix64(mix64(mix64(seed) ^ a) ^ (b * 0xd6e8feb86659fd93ULL));
}

}  // namespace dtrain::data
