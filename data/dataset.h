// Dataset: random access to the samples of one split (train or validation),
// and Batch: the preallocated buffers a Loader fills and a worker consumes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::data {

enum class Task { kLm, kClassification };
enum class Input { kTokens, kPatches };

// What a sample looks like; fixed for the dataset's lifetime.
struct DatasetInfo {
  std::string name{};  // for messages: "tokens 'train_*.bin' (train)"
  Task task = Task::kLm;
  Input input = Input::kTokens;
  int seq_len = 0;      // T: tokens (or patches) per sample
  int vocab_size = 0;   // tokens input: every token is < vocab_size
  int num_classes = 0;  // classification: every label is < num_classes
  int patch_size = 0;   // patches input: a patch is patch_size x patch_size values
};

// A language-modelling dataset over tokens.
inline DatasetInfo lm_tokens_info(std::string name, int seq_len, int vocab_size) {
  return DatasetInfo{.name = std::move(name), .seq_len = seq_len, .vocab_size = vocab_size};
}

// One micro-batch of `rows` samples, row-major. Allocated once per Loader slot
// (make_batch) and overwritten in place, so steady-state steps do not allocate.
struct Batch {
  int rows = 0;
  int seq_len = 0;               // T
  int patch_dim = 0;             // values per patch (patch_size^2); 0 for token input
  std::vector<int32_t> tokens;   // [rows, T] input tokens (token input only)
  std::vector<float> patches;    // [rows, T, patch_dim] normalized pixels (patch input only)
  std::vector<int32_t> targets;  // LM: [rows, T] next tokens; classification: [rows] labels
  int64_t first_sample = 0;      // global sample index of row 0
};

// An immutable split. fill() is const and touches no shared mutable state, so
// several loaders (threads) may fill from one dataset at once.
class Dataset {
 public:
  explicit Dataset(DatasetInfo info) : info_(std::move(info)) {}
  virtual ~Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  const DatasetInfo& info() const { return info_; }

  // Number of distinct samples: LM windows of T+1 tokens, or examples.
  virtual int64_t size() const = 0;

  // Writes sample `index` (0 <= index < size(); the sampler maps global sample
  // indices to it) into row `row` of `batch`, which make_batch sized for this
  // dataset. Must not allocate.
  virtual void fill(int64_t index, Batch& batch, int row) const = 0;

 private:
  DatasetInfo info_;
};

// A batch of `rows` samples shaped for `info`, zero-filled.
Batch make_batch(const DatasetInfo& info, int rows);

}  // namespace dtrain::data
