// `dtrain-bench train`: steady-state training throughput of one process, or
// of a data-parallel job (started by mpirun, srun or dtrain-launch) over the
// configured backend and ZeRO stage: tokens/s of all ranks, communication
// hidden behind backward, and each rank's model-state memory.
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

// Prints (rank 0 only) a table, then `name: value` lines. Returns the
// process exit code. Every rank of a job calls it.
int run_train_bench(const TrainBenchOptions& options);

}  // namespace dtrain::tools
