#include "data/datasets.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "data/fashion_mnist.h"
#include "data/hash.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "data/text_bytes.h"
#include "data/token_shard.h"
#include "data/token_stream_dataset.h"

namespace dtrain::data {
namespace {

using Stream = std::shared_ptr<const std::vector<uint16_t>>;

void require_model_kind(const DataSpec& spec, const char* wanted) {
  if (spec.model_kind != wanted) {
    throw ConfigError("model.kind", fmt::format("is '{}' but data.kind '{}' needs model.kind '{}'",
                                                spec.model_kind, spec.kind, wanted));
  }
}

void require_seq_len(const DataSpec& spec) {
  if (spec.seq_len <= 0) {
    throw ConfigError("data.seq_len", fmt::format("must be positive, got {}", spec.seq_len));
  }
}

Stream load_stream(const DataSpec& spec, const std::string& path) {
  if (spec.kind == "text") {
    return std::make_shared<const std::vector<uint16_t>>(read_text_bytes(path));
  }
  return std::make_shared<const std::vector<uint16_t>>(read_token_shards(path, spec.vocab_size));
}

std::shared_ptr<const Dataset> stream_split(const DataSpec& spec, Stream stream, int64_t begin,
                                            int64_t end, const std::string& what) {
  if (lm_window_count(end - begin, spec.seq_len) < 1) {
    throw ConfigError("data.seq_len",
                      fmt::format("is {} but {} holds {} tokens, fewer than seq_len + 1; lower "
                                  "data.seq_len or add data",
                                  spec.seq_len, what, end - begin));
  }
  return std::make_shared<TokenStreamDataset>(std::move(stream), begin, end, spec.seq_len,
                                              spec.vocab_size, what);
}

// data.kind tokens (llm.c shards) or text (bytes): LM windows over a stream.
DatasetPair make_stream_datasets(const DataSpec& spec) {
  require_model_kind(spec, "lm");
  require_seq_len(spec);
  if (spec.path.empty()) {
    throw ConfigError("data.path", fmt::format("data.kind '{}' needs data.path ({})", spec.kind,
                                               spec.kind == "text" ? "a text file or folder"
                                                                   : "a shard file or glob"));
  }
  if (spec.kind == "text" && spec.vocab_size < kTextVocabSize) {
    throw ConfigError("model.vocab_size",
                      fmt::format("is {} but text data has byte tokens 0..255; set it to >= {}",
                                  spec.vocab_size, kTextVocabSize));
  }
  if (spec.kind == "tokens" && spec.vocab_size <= 0) {
    throw ConfigError("model.vocab_size", fmt::format("must be positive, got {}", spec.vocab_size));
  }
  const Stream train = load_stream(spec, spec.path);
  const auto n = static_cast<int64_t>(train->size());
  const std::string name = fmt::format("{} '{}'", spec.kind, spec.path);
  if (!spec.val_path.empty()) {
    const Stream val = load_stream(spec, spec.val_path);
    const auto n_val = static_cast<int64_t>(val->size());
    return {stream_split(spec, train, 0, n, name + " (train)"),
            stream_split(spec, val, 0, n_val,
                         fmt::format("{} '{}' (validation)", spec.kind, spec.val_path))};
  }
  // No data.val_path: the last kHoldOutPercent of the stream is the validation
  // split, and training never reads it.
  const int64_t held_out = n * kHoldOutPercent / 100;
  return {stream_split(spec, train, 0, n - held_out,
                       fmt::format("{} (train: first {}%)", name, 100 - kHoldOutPercent)),
          stream_split(spec, train, n - held_out, n,
                       fmt::format("{} (validation: last {}%)", name, kHoldOutPercent))};
}

DatasetPair make_fashion_datasets(const DataSpec& spec) {
  require_model_kind(spec, "classifier");
  if (spec.num_classes != kFashionClasses) {
    throw ConfigError("model.num_classes", fmt::format("is {} but Fashion-MNIST has {} classes",
                                                       spec.num_classes, kFashionClasses));
  }
  // Checked before the (slow) load; the dataset checks the real image size too.
  if (spec.patch_size <= 0 || 28 % spec.patch_size != 0) {
    throw ConfigError("model.patch_size",
                      fmt::format("{} does not divide the 28x28 Fashion-MNIST images; use 1, 2, "
                                  "4, 7, 14 or 28",
                                  spec.patch_size));
  }
  const std::string dir = spec.path.empty() ? kFashionMnistDir : spec.path;
  const std::string val_dir = spec.val_path.empty() ? dir : spec.val_path;
  return {FashionMnistDataset::open(dir, "train", spec.patch_size),
          FashionMnistDataset::open(val_dir, "t10k", spec.patch_size)};
}

DatasetPair make_synthetic_datasets(const DataSpec& spec) {
  require_seq_len(spec);
  if (spec.model_kind == "lm") {
    if (spec.vocab_size < 2) {
      throw ConfigError("model.vocab_size", fmt::format("must be >= 2, got {}", spec.vocab_size));
    }
    const int64_t train_tokens =
        spec.synthetic_train_size > 0 ? spec.synthetic_train_size : kSyntheticLmTrainTokens;
    const int64_t val_tokens =
        spec.synthetic_val_size > 0 ? spec.synthetic_val_size : kSyntheticLmValTokens;
    if (lm_window_count(std::min(train_tokens, val_tokens), spec.seq_len) < 1) {
      throw ConfigError("data.seq_len",
                        fmt::format("is {} but the synthetic streams hold {} and {} "
                                    "tokens; lower it",
                                    spec.seq_len, train_tokens, val_tokens));
    }
    // Validation is another stream of the same rule (a derived seed).
    return {std::make_shared<SyntheticLmDataset>(train_tokens, spec.seq_len, spec.vocab_size,
                                                 spec.seed, "synthetic lm (train)"),
            std::make_shared<SyntheticLmDataset>(val_tokens, spec.seq_len, spec.vocab_size,
                                                 hash3(spec.seed, 1, 0x56414c),
                                                 "synthetic lm (validation)")};
  }
  require_model_kind(spec, "classifier");
  if (spec.num_classes < 2) {
    throw ConfigError("model.num_classes", fmt::format("must be >= 2, got {}", spec.num_classes));
  }
  if (spec.vocab_size < spec.num_classes) {
    throw ConfigError("model.vocab_size", fmt::format("is {} but the synthetic classifier needs at "
                                                      "least model.num_classes ({}) tokens",
                                                      spec.vocab_size, spec.num_classes));
  }
  const int64_t train_n =
      spec.synthetic_train_size > 0 ? spec.synthetic_train_size : kSyntheticClassifierTrainExamples;
  const int64_t val_n =
      spec.synthetic_val_size > 0 ? spec.synthetic_val_size : kSyntheticClassifierValExamples;
  // Validation examples are the indices after the training ones: disjoint.
  return {std::make_shared<SyntheticClassifierDataset>(train_n, 0, spec.seq_len, spec.vocab_size,
                                                       spec.num_classes, spec.seed,
                                                       "synthetic classifier (train)"),
          std::make_shared<SyntheticClassifierDataset>(val_n, train_n, spec.seq_len,
                                                       spec.vocab_size, spec.num_classes, spec.seed,
                                                       "synthetic classifier (validation)")};
}

}  // namespace

DatasetPair make_datasets(const DataSpec& spec) {
  if (spec.kind == "tokens" || spec.kind == "text") return make_stream_datasets(spec);
  if (spec.kind == "fashion_mnist") return make_fashion_datasets(spec);
  if (spec.kind == "synthetic") return make_synthetic_datasets(spec);
  throw ConfigError(
      "data.kind",
      fmt::format("'{}' is not one of tokens, text, fashion_mnist, synthetic", spec.kind));
}

}  // namespace dtrain::data
