// dtrain-bench: benchmarks whose figures can be compared (docs/performance.md, "How the figures are measured").
//   dtrain-bench train --config FILE [--steps N] [--warmup W] [--peak-seconds S] [--peak-flops F] [--profile]
//       [--set a.b=v ...]
//       (multi-rank under mpirun, srun or dtrain-launch: ZeRO stage parallel.zero_stage)
//   dtrain-bench checkpoint --config FILE [--dir D] [--repeats R] [--set a.b=v ...]
//   dtrain-bench allreduce|reduce_scatter|allgather|broadcast --backend auto|gloo|mpi|nccl
//       [--min-bytes 8] [--max-bytes 64M] [--step-factor 2] [--iters 20] [--warmup 5]
//       [--dtype f32|bf16|f16] [--op sum|avg|max] [--root R] [--timeout-s S]
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/command_line.h"
#include "core/openmp_wait.h"
#include "core/process.h"
#include "tools/bench_collectives.h"
#include "tools/bench_checkpoint.h"
#include "tools/bench_train.h"

namespace {

using dtrain::tools::CollectiveBenchOptions;

CLI::App* add_train_command(CLI::App& app, dtrain::tools::TrainBenchOptions& train) {
  CLI::App* cmd = app.add_subcommand("train", "steady-state training throughput and MFU (one or more ranks)");
  cmd->add_option("--config", train.config_path, "training config (JSON)")->required();
  cmd->add_option("--steps", train.steps, "timed steps")->check(dtrain::at_least(1));
  cmd->add_option("--warmup", train.warmup, "untimed steps first");
  cmd->add_option("--peak-seconds", train.peak_seconds,
                  "time spent measuring the GEMM peak, before the steps and again after (the better counts)")
      ->check(dtrain::more_than(0));
  cmd->add_option("--peak-flops", train.peak_flops,
                  "device cuda: the GPU's peak FLOP/s for MFU (default: H100/H200 dense, 989e12 bf16/fp16, 67e12 fp32)");
  cmd->add_flag("--profile", train.profile,
               "device cpu: time every kernel of the timed steps (ms, share, calls, GFLOP/s or GB/s per step)");
  cmd->add_option("--set", train.overrides, "override a config field")->take_all();
  return cmd;
}

// One subcommand per collective; they share the options (only one parses).
CLI::App* add_collective_command(CLI::App& app, const char* name, const char* description,
                                 CollectiveBenchOptions& o) {
  CLI::App* cmd = app.add_subcommand(name, description);
  cmd->add_option("--backend", o.backend, "auto | gloo | mpi | nccl")
      ->check(CLI::IsMember({"auto", "gloo", "mpi", "nccl"}))->capture_default_str();
  cmd->add_option("--min-bytes", o.min_bytes, "smallest size (K/M/G suffixes: powers of 1024)")
      ->transform(CLI::AsSizeValue(false))->capture_default_str();
  cmd->add_option("--max-bytes", o.max_bytes, "largest size")
      ->transform(CLI::AsSizeValue(false))->capture_default_str();
  cmd->add_option("--step-factor", o.step_factor, "size multiplier between rows")
      ->capture_default_str();
  cmd->add_option("--iters", o.iters, "timed operations per size")
      ->check(dtrain::at_least(1))->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed operations per size first")
      ->check(dtrain::at_least(0))->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "f32 | bf16 | f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))->capture_default_str();
  cmd->add_option("--op", o.op, "sum | avg | max (reductions only)")
      ->check(CLI::IsMember({"sum", "avg", "max"}))->capture_default_str();
  cmd->add_option("--root", o.root, "broadcast root rank")->capture_default_str();
  cmd->add_option("--timeout-s", o.timeout_s, "per operation and for rendezvous")
      ->check(dtrain::at_least(1))->capture_default_str();
  return cmd;
}

}  // namespace

CLI::App* add_checkpoint_command(CLI::App& app, dtrain::tools::CheckpointBenchOptions& o) {
  CLI::App* cmd = app.add_subcommand("checkpoint", "checkpoint save/load throughput vs plain write/read; async blocking");
  cmd->add_option("--config", o.config_path, "training config (JSON)")->required();
  cmd->add_option("--dir", o.dir, "write under this directory (default: the temporary directory)");
  cmd->add_option("--repeats", o.repeats, "rounds; figures are medians")->check(dtrain::at_least(1))
      ->capture_default_str();
  cmd->add_option("--settle", o.settle_s,
                  "seconds to let the storage settle (after a sync) before every timed operation")
      ->check(dtrain::at_least(0))
      ->capture_default_str();
  cmd->add_option("--set", o.overrides, "override a config field")->take_all();
  return cmd;
}

int main(int argc, char** argv) {
  dtrain::choose_openmp_wait_policy(argv);  // first: it may execute the program again
  CLI::App app{"dtrain-bench: training and communication benchmarks"};
  app.require_subcommand(1);
  dtrain::tools::TrainBenchOptions train;
  CLI::App* train_cmd = add_train_command(app, train);
  dtrain::tools::CheckpointBenchOptions checkpoint;
  CLI::App* checkpoint_cmd = add_checkpoint_command(app, checkpoint);
  CollectiveBenchOptions collective;
  std::vector<CLI::App*> collective_cmds = {
      add_collective_command(app, "allreduce", "allreduce bandwidth and correctness", collective),
      add_collective_command(app, "reduce_scatter", "reduce_scatter bandwidth and correctness",
                             collective),
      add_collective_command(app, "allgather", "allgather bandwidth and correctness", collective),
      add_collective_command(app, "broadcast", "broadcast bandwidth and correctness", collective)};
  if (const auto code = dtrain::parse_args(app, argc, argv, "dtrain-bench")) return *code;
  return dtrain::run_main("dtrain-bench", [&] {
    dtrain::configure_malloc_for_training();  // before any benchmark allocates
    if (train_cmd->parsed()) return dtrain::tools::run_train_bench(train);
    if (checkpoint_cmd->parsed()) return dtrain::tools::run_checkpoint_bench(checkpoint);
    for (CLI::App* cmd : collective_cmds) {
      if (!cmd->parsed()) continue;
      collective.collective = cmd->get_name();
      return dtrain::tools::run_collective_bench(collective);
    }
    return 0;
  });
}
