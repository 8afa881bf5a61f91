// dtrain-bench: benchmarks whose figures can be compared (DESIGN.md, "Command lines").
//   dtrain-bench train --config FILE [--steps N] [--warmup W] [--set a.b=v ...]
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/process.h"
#include "tools/bench_train.h"

int main(int argc, char** argv) {
  dtrain::configure_malloc_for_training();
  CLI::App app{"dtrain-bench: training and communication benchmarks"};
  app.require_subcommand(1);
  dtrain::tools::TrainBenchOptions train;
  CLI::App* train_cmd = app.add_subcommand("train", "steady-state training throughput and MFU");
  train_cmd->add_option("--config", train.config_path, "training config (JSON)")->required();
  train_cmd->add_option("--steps", train.steps, "timed steps")->check(CLI::PositiveNumber);
  train_cmd->add_option("--warmup", train.warmup, "untimed steps first");
  train_cmd->add_option("--set", train.overrides, "override a config field")->take_all();
  CLI11_PARSE(app, argc, argv);
  try {
    if (train_cmd->parsed()) return dtrain::tools::run_train_bench(train);
  } catch (const dtrain::Error& e) {
    std::cerr << "dtrain-bench: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain-bench: unexpected error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
