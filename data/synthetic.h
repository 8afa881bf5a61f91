// Synthetic tasks for tests and benchmarks: every sample is a pure function of
// (seed, index), computed on the fly in O(seq_len) with no stored data.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace dtrain::data {

// A virtual stream of `tokens` tokens over [0, vocab) cut into runs of
// kRunLength: a run starts at a random token, then
//   next = (prev * 5 + 3 + noise) % vocab,  noise = 0 (p 3/4), 1 or 2 (p 1/8 each).
// A model that learns the map reaches about 0.74 nats + ln(vocab)/kRunLength
// per token, well below ln(vocab); a model that learns nothing stays at ln(vocab).
class SyntheticLmDataset final : public Dataset {
 public:
  static constexpr int64_t kRunLength = 64;

  SyntheticLmDataset(int64_t tokens, int seq_len, int vocab_size, uint64_t seed, std::string name);

  int64_t size() const override { return windows_; }
  void fill(int64_t index, Batch& batch, int row) const override;

  // Token at stream position `pos` (O(kRunLength)).
  int32_t token_at(int64_t pos) const;

 private:
  int32_t run_start(int64_t run) const;
  int32_t step(int32_t prev, int64_t pos) const;

  uint64_t seed_;
  int64_t windows_;
};

// Example i (global index first_index + i) has label c = hash(seed, index) %
// num_classes and seq_len tokens, each with probability 1/2 drawn from the
// class's tokens {t < vocab : t % num_classes == c}, else uniform over the
// vocabulary. Mean-pooled token embeddings separate the classes. Train and
// validation use disjoint index ranges of one seed.
class SyntheticClassifierDataset final : public Dataset {
 public:
  SyntheticClassifierDataset(int64_t examples, int64_t first_index, int seq_len, int vocab_size,
                             int num_classes, uint64_t seed, std::string name);

  int64_t size() const override { return examples_; }
  void fill(int64_t index, Batch& batch, int row) const override;

  int32_t label(int64_t index) const;

 private:
  int64_t examples_;
  int64_t first_index_;
  uint64_t seed_;
};

}  // namespace dtrain::data
