// Which sample each rank reads: pure index math, independent of the dataset.
//
// W ranks, micro-batch B. Global micro-batch g holds W*B samples; rank r's row
// i is sample j = r*B + i of it, global sample index s = g*W*B + j. So N ranks
// with micro-batch B read exactly what one rank with micro-batch N*B reads,
// and the data position of a run is one number: the next global sample index.
//
// Sample s reads item (LM window or example) s mod n without shuffling; with
// shuffling, epoch e = s / n reads a permutation of the n items seeded by
// (seed, e): item perm_e[s mod n]. Every item is read once per epoch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dtrain::data {

// LM windows of T+1 tokens starting at k*T in a stream of n_tokens tokens.
constexpr int64_t lm_window_count(int64_t n_tokens, int64_t seq_len) {
  return n_tokens < 1 ? 0 : (n_tokens - 1) / seq_len;
}
constexpr int64_t lm_window_start(int64_t window, int64_t seq_len) { return window * seq_len; }

// Global sample index of rank `rank`'s row `row` in global micro-batch `batch`,
// counted from global sample `start`.
constexpr int64_t global_sample(int64_t start, int64_t batch, int rank, int row, int world,
                                int micro_batch) {
  return start + batch * world * micro_batch + static_cast<int64_t>(rank) * micro_batch + row;
}

// Writes the permutation of [0, out.size()) for (seed, epoch) into `out`:
// Fisher-Yates driven by std::mt19937_64 with an exact bounded draw, so the
// result is the same with every standard library.
void epoch_permutation(uint64_t seed, int64_t epoch, std::span<int64_t> out);
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Maps global sample indices to items, caching the current epoch's
// permutation (allocated once). Not thread-safe: one owner (a Loader's
// producer) calls item().
class Sampler {
 public:
  Sampler(int64_t items, uint64_t seed, bool shuffle);

  int64_t items() const { return items_; }
  int64_t item(int64_t global_sample);

 private:
  int64_t items_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace dtrain::data
