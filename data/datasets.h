// make_datasets: the train and validation splits a run's config asks for.
// DataSpec is a plain struct so data/ does not depend on the config schema;
// the worker copies the config fields named in the comments into it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"

namespace dtrain::data {

struct DataSpec {
  std::string kind{};        // data.kind: tokens | text | fashion_mnist | synthetic
  std::string path{};        // data.path (fashion_mnist: defaults to kFashionMnistDir)
  std::string val_path{};    // data.val_path; empty: hold out the end of the training data
  int seq_len = 0;           // data.seq_len (fashion_mnist: derived from model.patch_size)
  int vocab_size = 0;        // model.vocab_size
  int num_classes = 0;       // model.num_classes
  int patch_size = 0;        // model.patch_size
  std::string model_kind{};  // model.kind: lm | classifier
  uint64_t seed = 0;         // train.seed: seeds the synthetic data
  // Synthetic sizes: LM stream tokens, or classifier examples (0: defaults below).
  int64_t synthetic_train_size = 0;
  int64_t synthetic_val_size = 0;
};

inline constexpr int64_t kSyntheticLmTrainTokens = int64_t{1} << 20;
inline constexpr int64_t kSyntheticLmValTokens = int64_t{1} << 16;
inline constexpr int64_t kSyntheticClassifierTrainExamples = int64_t{1} << 16;
inline constexpr int64_t kSyntheticClassifierValExamples = int64_t{1} << 12;

// Fraction of a token stream held out for validation when data.val_path is empty.
inline constexpr int kHoldOutPercent = 10;

struct DatasetPair {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> val;
};

// Loads or generates both splits. Throws ConfigError naming the field
// ("data.kind", "data.seq_len", "model.patch_size", ...) for settings that do
// not fit the data, IoError / DataError (naming the file) for missing or bad
// files.
DatasetPair make_datasets(const DataSpec& spec);

}  // namespace dtrain::data
