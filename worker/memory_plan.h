// What one rank's training will hold in memory, worked out before anything
// large is allocated: the engine's state for the ZeRO stage and world size
// (sharding::Engine::plan_memory), the model's activations
// (nn::planned_activation_bytes), the data loaders' batches, and what the
// process holds already (the binary, its libraries, the datasets). The
// trainer refuses to start a run that cannot fit (check_fits), and
// `dtrain-worker --dry-run` prints the plan (describe).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "proto/config.pb.h"
#include "sharding/engine.h"

namespace dtrain::worker {

struct MemoryPlan {
  sharding::MemoryStats state;       // parameters, gradients, moments, working buffers
  std::int64_t activation_bytes = 0;  // activations, backward scratch, staged inputs
  std::int64_t weight_copy_bytes = 0; // the linears' weights in oneDNN's layout (cpu::gemm_weights)
  std::int64_t matmul_copy_bytes = 0; // the linear products' operand copies (cpu::gemm_scratch_bytes)
  std::int64_t loader_bytes = 0;      // the train and held-out loaders' batches
  std::int64_t resident_bytes = 0;    // held by the process already (resident set size now)
  bool on_device = false;             // state and activations live in GPU memory, not the host's
  // Host bytes the run will hold: resident, loaders, and (on the host) state and activations.
  std::int64_t host_total() const;
  // Bytes still to be allocated on the host.
  std::int64_t host_to_allocate() const;
};

// The plan for `config` on `world` ranks with sequences of `seq_len`.
MemoryPlan plan_memory(const config::Config& config, int world, std::int64_t seq_len);

// Bytes the machine can still give (MemAvailable of /proc/meminfo), or
// DTRAIN_MEMORY_LIMIT_MB where that is less (a share of a node that other
// jobs use too).
std::int64_t available_memory_bytes();

// The plan as a table, one line per kind, in MiB.
std::string describe(const MemoryPlan& plan, const config::Config& config, int world);

// The plan of another config of the same run (world, sequence length).
using Replan = std::function<MemoryPlan(const config::Config&)>;

// Throws dtrain::Error when `ranks_on_node` ranks, each allocating
// plan.host_to_allocate(), do not fit in `available` bytes, naming the
// estimate, the memory available and what to change: with `replan`, the
// first of activation recompute (model.recompute selective, then full) and
// ZeRO stage 3 (alone, then with recompute) whose plan fits, with its
// figures; else parallel.zero_stage, more ranks, train.micro_batch_size.
void check_fits(const MemoryPlan& plan, std::int64_t available, int ranks_on_node, const config::Config& config,
                const Replan& replan = {});

}  // namespace dtrain::worker
