// `dtrain-bench train`: steady-state training throughput of one process.
#pragma once

#include <string>
#include <vector>

namespace dtrain::tools {

struct TrainBenchOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int steps = 20;
  int warmup = 3;
  double peak_seconds = 1.0;  // time spent measuring the GEMM peak
};

// Prints a table, then `name: value` lines. Returns the process exit code.
int run_train_bench(const TrainBenchOptions& options);

}  // namespace dtrain::tools
