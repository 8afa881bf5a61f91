// `dtrain-bench train`: steady-state training throughput of one process, or
// of a data-parallel job (started by mpirun, srun or dtrain-launch) over the
// configured backend and ZeRO stage: tokens/s of all ranks, communication
// hidden behind backward, and each rank's model-state memory. With
// `--set device=cuda` the steps run on the GPU (one process) and MFU is
// against the GPU's peak (--peak-flops) instead of the measured CPU GEMM peak.
// With --profile (device cpu) it adds the timed steps' time per kernel
// (tools/bench_profile.h).
#pragma once

#include <string>
#include <vector>

namespace dtrain::tools {

struct TrainBenchOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int steps = 20;
  int warmup = 3;
  double peak_seconds = 1.0;  // time spent measuring the GEMM peak, before the steps and again after
  // device cuda: the GPU's peak FLOP/s that MFU divides by (0: H100/H200's
  // dense figure for the precision, 989e12 for bf16/fp16 and 67e12 for fp32).
  double peak_flops = 0.0;
  bool profile = false;  // time every kernel of the timed steps (device cpu)
};

// Prints (rank 0 only) a table, then `name: value` lines. Returns the
// process exit code. Every rank of a job calls it.
int run_train_bench(const TrainBenchOptions& options);

}  // namespace dtrain::tools
