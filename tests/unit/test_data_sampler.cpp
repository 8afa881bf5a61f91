// Sampler math: window layout, world-size independence, shuffle determinism
// and per-epoch coverage.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "data/sampler.h"

namespace dtrain::data {
namespace {

TEST(Sampler, LmWindowsOverlapByOneToken) {
  EXPECT_EQ(lm_window_count(101, 10), 10);  // windows [0,10], [10,20], ..., [90,100]
  EXPECT_EQ(lm_window_count(100, 10), 9);
  EXPECT_EQ(lm_window_count(11, 10), 1);
  EXPECT_EQ(lm_window_count(10, 10), 0);
  EXPECT_EQ(lm_window_count(0, 10), 0);
  EXPECT_EQ(lm_window_start(7, 10), 70);
}

TEST(Sampler, GlobalSampleMatchesDesignFormula) {
  // docs/ARCHITECTURE.md: global micro-batch g, sample j = r*B + i is global sample g*W*B + j.
  EXPECT_EQ(global_sample(0, 3, 1, 2, 4, 5), 3 * 4 * 5 + 1 * 5 + 2);
  EXPECT_EQ(global_sample(1000, 0, 0, 0, 8, 2), 1000);
}

// Items a rank reads in global micro-batch g, in row order.
std::vector<int64_t> rank_items(Sampler& s, int64_t g, int rank, int world, int micro_batch) {
  std::vector<int64_t> items;
  for (int i = 0; i < micro_batch; ++i)
    items.push_back(s.item(global_sample(0, g, rank, i, world, micro_batch)));
  return items;
}

TEST(Sampler, TwoRanksOfTwoReadWhatOneRankOfFourReads) {
  for (bool shuffle : {false, true}) {
    Sampler two(13, 7, shuffle);
    Sampler one(13, 7, shuffle);
    for (int64_t g = 0; g < 20; ++g) {  // several epochs of 13 items
      std::vector<int64_t> both = rank_items(two, g, 0, 2, 2);
      const std::vector<int64_t> r1 = rank_items(two, g, 1, 2, 2);
      both.insert(both.end(), r1.begin(), r1.end());
      EXPECT_EQ(both, rank_items(one, g, 0, 1, 4)) << "g=" << g << " shuffle=" << shuffle;
    }
  }
}

TEST(Sampler, UnshuffledSampleReadsItsIndexModuloSize) {
  Sampler s(10, 0, false);
  EXPECT_EQ(s.item(0), 0);
  EXPECT_EQ(s.item(9), 9);
  EXPECT_EQ(s.item(23), 3);
}

TEST(Sampler, PermutationIsDeterministicAndDependsOnSeedAndEpoch) {
  const std::vector<int64_t> a = epoch_permutation(1000, 42, 0);
  EXPECT_EQ(a, epoch_permutation(1000, 42, 0));
  EXPECT_NE(a, epoch_permutation(1000, 42, 1));
  EXPECT_NE(a, epoch_permutation(1000, 43, 0));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(a, iota);
}

TEST(Sampler, PermutationIsPinned) {
  // The order is part of the reproducibility contract (another implementation,
  // or a resumed run, must read the same windows): changing the algorithm
  // must be a deliberate decision that updates these values. They were also
  // produced by an independent Python implementation (splitmix64 seed mixing,
  // mt19937_64, rejection draw, Fisher-Yates from the top).
  const std::vector<int64_t> p = epoch_permutation(8, 1234, 5);
  EXPECT_EQ(p, (std::vector<int64_t>{1, 6, 7, 4, 0, 3, 5, 2}));
}

TEST(Sampler, ShuffledEpochsCoverEveryItemOnce) {
  const int64_t n = 37;
  Sampler s(n, 99, true);
  std::vector<int64_t> previous;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    std::vector<int64_t> seen;
    for (int64_t k = 0; k < n; ++k) seen.push_back(s.item(epoch * n + k));
    EXPECT_EQ(seen, epoch_permutation(n, 99, epoch));
    std::set<int64_t> unique(seen.begin(), seen.end());
    EXPECT_EQ(static_cast<int64_t>(unique.size()), n);
    EXPECT_EQ(*unique.begin(), 0);
    EXPECT_EQ(*unique.rbegin(), n - 1);
    EXPECT_NE(seen, previous);
    previous = seen;
  }
  // Going back to an earlier epoch (a reset loader) recomputes it.
  EXPECT_EQ(s.item(3), epoch_permutation(n, 99, 0)[3]);
}

TEST(Sampler, SingleItemAlwaysReadsItemZero) {
  Sampler s(1, 5, true);
  EXPECT_EQ(s.item(0), 0);
  EXPECT_EQ(s.item(17), 0);
}

}  // namespace
}  // namespace dtrain::data
