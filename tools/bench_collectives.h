// `dtrain-bench allreduce|reduce_scatter|allgather|broadcast`: bandwidth and
// correctness of one collective of comm::Communicator over a sweep of sizes,
// printed as nccl-tests prints it. Runs under whatever started the process
// (mpirun, srun, dtrain-launch, DTRAIN_* set by hand): every rank runs it,
// rank 0 prints.
#pragma once

#include <cstddef>
#include <string>

namespace dtrain::tools {

struct CollectiveBenchOptions {
  std::string collective = "allreduce";  // allreduce | reduce_scatter | allgather | broadcast
  std::string backend = "auto";          // auto | gloo | mpi | nccl
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  double step_factor = 2.0;
  int iters = 20;
  int warmup = 5;
  std::string dtype = "f32";  // f32 | bf16 | f16
  std::string op = "sum";     // sum | avg | max (allreduce, reduce_scatter)
  int root = 0;               // broadcast
  int timeout_s = 300;        // per operation and for rendezvous
};

// Prints the table and `name: value` lines on rank 0. Returns the process
// exit code: 0 when every element of every check was right, 1 otherwise.
// Throws dtrain::Error (ConfigError for bad options) on failure.
int run_collective_bench(const CollectiveBenchOptions& options);

}  // namespace dtrain::tools
