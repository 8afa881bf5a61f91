#include "tools/bench_train.h"

#include <omp.h>

#include <algorithm>
#include <iostream>

#include <fmt/format.h>

#include "core/process.h"
#include "nn/cpu/matmul.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::tools {

int run_train_bench(const TrainBenchOptions& options) {
  config::Config config = worker::load_config(options.config_path, options.overrides);
  // Enough steps that the schedule never ends inside the measurement.
  config.mutable_train()->set_steps(options.warmup + options.steps + 1);
  worker::Trainer trainer(config, {.write_outputs = false, .console = nullptr});
  const nn::ModelConfig& model = trainer.model();
  const std::int64_t seq = trainer.seq_len();  // the dataset's, e.g. patches per image
  const double flops_per_token = model.flops_per_token(seq);
  const double peak = nn::cpu::measure_gemm_peak_gflops(2048, options.peak_seconds);

  for (int i = 0; i < options.warmup; ++i) trainer.step();
  const long faults_before = minor_page_faults();
  std::vector<double> seconds;
  for (int i = 0; i < options.steps; ++i) seconds.push_back(trainer.step().seconds);
  const long faults = minor_page_faults() - faults_before;

  double total = 0.0;
  for (double s : seconds) total += s;
  std::sort(seconds.begin(), seconds.end());
  const double mean_s = total / static_cast<double>(seconds.size());
  const double median_s = seconds[seconds.size() / 2];
  const auto tokens = static_cast<double>(trainer.tokens_per_step());
  const double tokens_per_s = tokens / mean_s;
  const double gflops = flops_per_token * tokens_per_s / 1e9;
  const double mfu = gflops / peak;

  std::cout << fmt::format(
      "dtrain-bench train: {} ({} model, {:.2f}M matmul params, {:.1f} MFLOP/token, "
      "micro-batch {} x {} tokens, {} thread(s))\n",
      options.config_path, config.model().kind(), static_cast<double>(model.matmul_params()) / 1e6,
      flops_per_token / 1e6, config.train().micro_batch_size(), seq, omp_get_max_threads());
  std::cout << fmt::format("{:>6} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>7}\n", "steps",
                           "tokens/step", "mean ms", "median ms", "best ms", "tokens/s",
                           "GFLOP/s", "mfu");
  std::cout << fmt::format("{:>6} {:>12.0f} {:>12.2f} {:>12.2f} {:>12.2f} {:>10.0f} {:>10.1f} "
                           "{:>7.3f}\n",
                           options.steps, tokens, 1e3 * mean_s, 1e3 * median_s,
                           1e3 * seconds.front(), tokens_per_s, gflops, mfu);
  std::cout << fmt::format("tokens_per_s: {:.1f}\n", tokens_per_s);
  std::cout << fmt::format("step_ms: {:.3f}\n", 1e3 * mean_s);
  std::cout << fmt::format("mfu: {:.4f}\n", mfu);
  std::cout << fmt::format("achieved_gflops: {:.2f}\n", gflops);
  std::cout << fmt::format("gemm_peak_gflops: {:.2f}\n", peak);
  std::cout << fmt::format("flops_per_token: {:.0f}\n", flops_per_token);
  std::cout << fmt::format("page_faults_per_step: {:.1f}\n",
                           static_cast<double>(faults) / options.steps);
  std::cout << fmt::format("peak_rss_mb: {:.1f}\n", peak_rss_mb());
  std::cout << fmt::format("threads: {}\n", omp_get_max_threads());
  std::cout << fmt::format("command: OMP_NUM_THREADS={} dtrain-bench train --config {} --steps {}\n",
                           omp_get_max_threads(), options.config_path, options.steps);
  return 0;
}

}  // namespace dtrain::tools
