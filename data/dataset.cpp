#include "data/dataset.h"

#include "core/error.h"

namespace dtrain::data {

Batch make_batch(const DatasetInfo& info, int rows) {
  DTRAIN_CHECK(rows > 0 && info.seq_len > 0, "rows {} seq_len {}", rows, info.seq_len);
  Batch b;
  b.rows = rows;
  b.seq_len = info.seq_len;
  const auto cells = static_cast<std::size_t>(rows) * static_cast<std::size_t>(info.seq_len);
  if (info.input == Input::kTokens) {
    b.tokens.assign(cells, 0);
  } else {
    b.patch_dim = info.patch_size * info.patch_size;
    b.patches.assign(cells * static_cast<std::size_t>(b.patch_dim), 0.0f);
  }
  b.targets.assign(info.task == Task::kLm ? cells : static_cast<std::size_t>(rows), 0);
  return b;
}

}  // namespace dtrain::data
