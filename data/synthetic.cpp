#include "data/synthetic.h"

#include "core/error.h"
#include "data/hash.h"
#include "data/sampler.h"

namespace dtrain::data {
namespace {

// Salts keep the hash streams of different purposes independent.
constexpr uint64_t kRunSalt = 0x52554e;      // "RUN"
constexpr uint64_t kNoiseSalt = 0x4e4f4953;  // "NOIS"
constexpr uint64_t kLabelSalt = 0x4c4142;    // "LAB"
constexpr uint64_t kTokenSalt = 0x544f4b;    // "TOK"

}  // namespace

SyntheticLmDataset::SyntheticLmDataset(int64_t tokens, int seq_len, int vocab_size, uint64_t seed,
                                       std::string name)
    : Dataset(lm_tokens_info(std::move(name), seq_len, vocab_size)),
      seed_(seed),
      windows_(seq_len > 0 ? lm_window_count(tokens, seq_len) : 0) {
  if (vocab_size < 2) {
    throw ConfigError("model.vocab_size", fmt::format("{}: synthetic text needs at least 2 tokens, got {}",
                                                      info().name, vocab_size));
  }
  if (windows_ <= 0) {
    throw ConfigError("data.seq_len", fmt::format("{}: its {} tokens hold no window of data.seq_len + 1 = {}; "
                                                  "lower data.seq_len",
                                                  info().name, tokens, seq_len + 1));
  }
}

int32_t SyntheticLmDataset::run_start(int64_t run) const {
  return static_cast<int32_t>(hash3(seed_, static_cast<uint64_t>(run), kRunSalt) %
                              static_cast<uint64_t>(info().vocab_size));
}

int32_t SyntheticLmDataset::step(int32_t prev, int64_t pos) const {
  const uint64_t h = hash3(seed_, static_cast<uint64_t>(pos), kNoiseSalt) & 7;
  const uint64_t noise = h < 6 ? 0 : h - 5;  // 0 for 6/8, 1 or 2 for 1/8 each
  return static_cast<int32_t>((static_cast<uint64_t>(prev) * 5 + 3 + noise) %
                              static_cast<uint64_t>(info().vocab_size));
}

int32_t SyntheticLmDataset::token_at(int64_t pos) const {
  const int64_t run_begin = pos - pos % kRunLength;
  int32_t t = run_start(pos / kRunLength);
  for (int64_t q = run_begin + 1; q <= pos; ++q) t = step(t, q);
  return t;
}

void SyntheticLmDataset::fill(int64_t index, Batch& batch, int row) const {
  const int T = info().seq_len;
  const int64_t start = lm_window_start(index, T);
  int32_t* tokens = batch.tokens.data() + static_cast<std::ptrdiff_t>(row) * T;
  int32_t* targets = batch.targets.data() + static_cast<std::ptrdiff_t>(row) * T;
  int32_t t = token_at(start);
  for (int i = 0; i < T; ++i) {
    tokens[i] = t;
    const int64_t pos = start + i + 1;
    t = pos % kRunLength == 0 ? run_start(pos / kRunLength) : step(t, pos);
    targets[i] = t;
  }
}

SyntheticClassifierDataset::SyntheticClassifierDataset(int64_t examples, int64_t first_index,
                                                       int seq_len, int vocab_size, int num_classes,
                                                       uint64_t seed, std::string name)
    : Dataset(DatasetInfo{.name = std::move(name),
                          .task = Task::kClassification,
                          .input = Input::kTokens,
                          .seq_len = seq_len,
                          .vocab_size = vocab_size,
                          .num_classes = num_classes}),
      examples_(examples),
      first_index_(first_index),
      seed_(seed) {
  DTRAIN_CHECK(examples > 0 && seq_len > 0, "{}: {} examples of {} tokens", info().name, examples,
               seq_len);
  if (num_classes < 2 || vocab_size < num_classes) {
    throw ConfigError("model.num_classes",
                      fmt::format("{}: the synthetic classification task needs 2 to model.vocab_size ({}) "
                                  "classes, got {}",
                                  info().name, vocab_size, num_classes));
  }
}

int32_t SyntheticClassifierDataset::label(int64_t index) const {
  const auto global = static_cast<uint64_t>(first_index_ + index);
  return static_cast<int32_t>(hash3(seed_, global, kLabelSalt) %
                              static_cast<uint64_t>(info().num_classes));
}

void SyntheticClassifierDataset::fill(int64_t index, Batch& batch, int row) const {
  const int T = info().seq_len;
  const auto V = static_cast<uint64_t>(info().vocab_size);
  const auto C = static_cast<uint64_t>(info().num_classes);
  const auto global = static_cast<uint64_t>(first_index_ + index);
  const auto c = static_cast<uint64_t>(label(index));
  const uint64_t class_tokens = (V - 1 - c) / C + 1;  // |{t < V : t % C == c}|
  int32_t* tokens = batch.tokens.data() + static_cast<std::ptrdiff_t>(row) * T;
  for (int i = 0; i < T; ++i) {
    const uint64_t h = hash3(seed_ ^ kTokenSalt, global, static_cast<uint64_t>(i));
    const uint64_t r = h >> 8;
    tokens[i] = static_cast<int32_t>((h & 0xff) < 128 ? c + (r % class_tokens) * C : r % V);
  }
  batch.targets[static_cast<std::size_t>(row)] = static_cast<int32_t>(c);
}

}  // namespace dtrain::data
