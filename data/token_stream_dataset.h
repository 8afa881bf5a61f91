// LM windows over an in-memory token stream (token shards or text bytes).
// Window k holds tokens [k*T, k*T + T] of the stream: inputs are the first T,
// targets the last T, so consecutive windows share one token and the stream
// yields (n_tokens - 1) / T windows (sampler.h: lm_window_count).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace dtrain::data {

class TokenStreamDataset final : public Dataset {
 public:
  // Views tokens [begin, end) of `stream`, which the dataset co-owns (train
  // and validation can share one stream). REQUIRES: end - begin >= seq_len + 1
  // and every token < vocab_size (make_datasets checks both with config names).
  TokenStreamDataset(std::shared_ptr<const std::vector<uint16_t>> stream, int64_t begin,
                     int64_t end, int seq_len, int vocab_size, std::string name);

  int64_t size() const override { return windows_; }
  void fill(int64_t index, Batch& batch, int row) const override;

  int64_t token_count() const { return end_ - begin_; }

 private:
  std::shared_ptr<const std::vector<uint16_t>> stream_;
  int64_t begin_;
  int64_t end_;
  int64_t windows_;
};

}  // namespace dtrain::data
