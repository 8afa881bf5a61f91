// `dtrain-bench checkpoint`: how fast one process saves and loads its
// training state, against a plain sequential write (write + fsync) and read
// of the same bytes in the same directory, measured in the same run; and how
// long an asynchronous save blocks training compared with a synchronous one.
// Reads start from cold pages (posix_fadvise DONTNEED after the fsync), for
// the checkpoint and the baseline alike. Saves keep every step (no deletion
// of older steps inside the measurement); the directory is removed at the end.
#pragma once

#include <string>
#include <vector>

namespace dtrain::tools {

struct CheckpointBenchOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string dir;   // where to write (a fresh temporary directory under it; removed after)
  int repeats = 3;   // each figure is the median of this many
  // Before every timed write and read: sync(2), then this pause, so no
  // measurement runs while the storage still writes back an earlier one.
  double settle_s = 2.0;
};

// Prints a table and `name: value` lines; returns the exit code.
int run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace dtrain::tools
