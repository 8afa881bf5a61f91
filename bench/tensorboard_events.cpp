// dtrain-bench-tensorboard: what TensorBoard events at every step cost a
// training step, in one process: the config's model trains (as
// `dtrain-bench train` does, one process), and every other step is followed
// by what dtrain-worker writes at a logged step (worker/tensorboard.h:
// eight scalars, one record, written to the file at once). Steps with and
// without events interleave, so a slow second of a shared machine hits both.
//
//   build/bin/dtrain-bench-tensorboard --config examples/configs/lm-small.json --steps 20
//
// Prints `name: value` lines: step_ms_events_on / _off (medians of the
// steps, the write included in "on"), write_us (mean time of one step's
// events), overhead_percent (write_us over the median step without events),
// event_bytes_per_step, and the command.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/command_line.h"
#include "core/error.h"
#include "core/process.h"
#include "worker/config.h"
#include "worker/tensorboard.h"
#include "worker/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::uintmax_t bytes_in(const std::filesystem::path& dir) {
  std::uintmax_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) total += e.file_size();
  return total;
}

struct Options {
  std::string config_path;
  int steps = 20;
  int warmup = 2;
  std::vector<std::string> overrides;
};

int bench(const Options& o) {
  const dtrain::config::Config config = dtrain::worker::load_config(o.config_path, o.overrides);
  dtrain::worker::Trainer trainer(config, {.write_outputs = false, .console = nullptr, .comm = nullptr});
  std::string pattern = (std::filesystem::temp_directory_path() / "dtrain-tb-bench-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) dtrain::throw_errno("cannot make a temporary folder", pattern);
  const std::filesystem::path dir = pattern;
  std::vector<double> on, off;
  double write_s = 0.0;
  std::uintmax_t bytes = 0;
  {
    dtrain::worker::TensorBoardLog log(dir, std::nullopt, dtrain::worker::config_to_json(config), std::cerr);
    const std::uintmax_t start_bytes = bytes_in(dir);
    for (int i = 0; i < o.warmup; ++i) trainer.step();
    for (int i = 0; i < o.steps; ++i) {
      const auto t0 = Clock::now();
      const dtrain::worker::StepResult r = trainer.step();
      if (i % 2 == 0) {
        const auto w0 = Clock::now();
        const double tokens_per_s = static_cast<double>(trainer.tokens_per_step()) / r.seconds;
        log.log_step(r.step, {r.loss, r.lr, r.grad_norm, tokens_per_s, 1e3 * r.seconds,
                              trainer.model().flops_per_token(trainer.seq_len()) * tokens_per_s / 1e12,
                              1e3 * trainer.engine().comm_stats().exposed_seconds, dtrain::peak_rss_mb()});
        const auto w1 = Clock::now();
        write_s += seconds(w0, w1);
        on.push_back(seconds(t0, w1));
      } else {
        off.push_back(seconds(t0, Clock::now()));
      }
    }
    if (!log.on()) throw dtrain::Error("the events could not be written to " + dir.string());
    bytes = bytes_in(dir) - start_bytes;
  }
  std::filesystem::remove_all(dir);
  const double write_us = 1e6 * write_s / static_cast<double>(on.size());
  std::cout << fmt::format("step_ms_events_on: {:.3f}\n", 1e3 * median(on));
  std::cout << fmt::format("step_ms_events_off: {:.3f}\n", 1e3 * median(off));
  std::cout << fmt::format("write_us: {:.1f}\n", write_us);
  std::cout << fmt::format("overhead_percent: {:.4f}\n", 100.0 * write_us / (1e6 * median(off)));
  std::cout << fmt::format("event_bytes_per_step: {}\n", bytes / on.size());
  std::string command = fmt::format("dtrain-bench-tensorboard --config {} --steps {} --warmup {}", o.config_path,
                                    o.steps, o.warmup);
  for (const std::string& s : o.overrides) command += " --set " + s;
  std::cout << "command: " << command << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dtrain::run_main("dtrain-bench-tensorboard", [&] {
    dtrain::configure_malloc_for_training();
    CLI::App app{"dtrain-bench-tensorboard: the cost of TensorBoard events at every step"};
    Options o;
    app.add_option("--config", o.config_path, "training config (JSON)")->required();
    app.add_option("--steps", o.steps, "timed steps, half of them with events")->check(CLI::Range(2, 100000));
    app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
    app.add_option("--set", o.overrides, "config override key.path=value (repeatable)");
    if (const auto code = dtrain::parse_args(app, argc, argv, "dtrain-bench-tensorboard")) return *code;
    return bench(o);
  });
}
