// dtrain-worker --config FILE.json [--set a.b=v ...]: trains one model.
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/process.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace {

void print_summary(const dtrain::worker::TrainSummary& s) {
  std::cout << fmt::format("done: {} steps in {:.1f} s | final loss {:.4f} | {:.0f} tok/s",
                           s.steps, s.seconds, s.final_loss, s.tokens_per_s);
  if (s.final_eval) {
    std::cout << fmt::format(" | eval loss {:.4f}", s.final_eval->loss);
    if (s.final_eval->accuracy) {
      std::cout << fmt::format(" | eval accuracy {:.2f}%", 100.0 * *s.final_eval->accuracy);
    }
    if (s.final_eval->perplexity) {
      std::cout << fmt::format(" | eval perplexity {:.3f}", *s.final_eval->perplexity);
    }
  }
  std::cout << fmt::format(" | peak RSS {:.0f} MiB\n", dtrain::peak_rss_mb());
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::configure_malloc_for_training();
  CLI::App app{"dtrain-worker: one rank of a dtrain training job"};
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "training config (JSON)")->required();
  app.add_option("--set", overrides, "override a config field: --set train.steps=100")
      ->take_all();
  CLI11_PARSE(app, argc, argv);
  try {
    const dtrain::config::Config config = dtrain::worker::load_config(config_path, overrides);
    std::cout << fmt::format("dtrain-worker: {} model, {} steps, out_dir {}\n",
                             config.model().kind(), config.train().steps(),
                             config.train().out_dir());
    dtrain::worker::Trainer trainer(config, {.write_outputs = true, .console = &std::cout});
    print_summary(trainer.run());
    return 0;
  } catch (const dtrain::Error& e) {
    std::cerr << "dtrain-worker: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain-worker: unexpected error: " << e.what() << "\n";
    return 3;
  }
}
