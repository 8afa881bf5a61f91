#include "data/token_stream_dataset.h"

#include "core/error.h"
#include "data/sampler.h"

namespace dtrain::data {

TokenStreamDataset::TokenStreamDataset(std::shared_ptr<const std::vector<uint16_t>> stream,
                                       int64_t begin, int64_t end, int seq_len, int vocab_size,
                                       std::string name)
    : Dataset(lm_tokens_info(std::move(name), seq_len, vocab_size)),
      stream_(std::move(stream)),
      begin_(begin),
      end_(end),
      windows_(lm_window_count(end - begin, seq_len)) {
  DTRAIN_CHECK(stream_ != nullptr && 0 <= begin && begin <= end &&
                   end <= static_cast<int64_t>(stream_->size()),
               "range [{}, {}) of a stream of {} tokens", begin, end,
               stream_ ? stream_->size() : 0);
  DTRAIN_CHECK(seq_len > 0, "{}: seq_len {}", info().name, seq_len);
  if (windows_ <= 0) {
    throw DataError(fmt::format("{}: its {} tokens hold no window of data.seq_len + 1 = {} tokens; lower "
                                "data.seq_len or give it more data",
                                info().name, end - begin, seq_len + 1));
  }
}

void TokenStreamDataset::fill(int64_t index, Batch& batch, int row) const {
  const int T = info().seq_len;
  const uint16_t* src = stream_->data() + begin_ + index * T;
  int32_t* tokens = batch.tokens.data() + static_cast<std::ptrdiff_t>(row) * T;
  int32_t* targets = batch.targets.data() + static_cast<std::ptrdiff_t>(row) * T;
  for (int t = 0; t < T; ++t) {
    tokens[t] = src[t];
    targets[t] = src[t + 1];
  }
}

}  // namespace dtrain::data
