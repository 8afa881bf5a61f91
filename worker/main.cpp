// dtrain-worker --config FILE.json [--set a.b=v ...]: trains one model.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <thread>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cluster/environment.h"
#include "comm/connect.h"
#include "core/error.h"
#include "core/process.h"
#include "worker/config.h"
#include "worker/signals.h"
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

// Ranks on one node split its cores unless OMP_NUM_THREADS says otherwise:
// several full-size OpenMP teams on the same cores spin against each other.
void share_cores(const dtrain::cluster::Environment& env) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr || env.local_world_size <= 1) return;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  omp_set_num_threads(std::max(1, cores / env.local_world_size));
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::configure_malloc_for_training();
  dtrain::worker::install_stop_signals();
  CLI::App app{"dtrain-worker: one rank of a dtrain training job"};
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "training config (JSON)")->required();
  app.add_option("--set", overrides, "override a config field: --set train.steps=100")
      ->take_all();
  CLI11_PARSE(app, argc, argv);
  try {
    const dtrain::config::Config config = dtrain::worker::load_config(config_path, overrides);
    // Who this process is (dtrain-launch, mpirun, srun or alone), the run's
    // store and the communicator; a failed collective leaves a comm thread
    // that may never return, so errors end the process with _Exit below.
    const auto env = dtrain::cluster::detect_environment(dtrain::cluster::process_environment());
    const auto timeout = std::chrono::seconds(config.parallel().timeout_s());
    dtrain::comm::OpenedStore store = dtrain::comm::open_store(env, timeout);
    dtrain::comm::ConnectOptions connect;
    connect.backend = config.parallel().backend();
    connect.device = config.device();
    connect.timeout = timeout;
    connect.store = store.store;
    std::shared_ptr<dtrain::comm::Communicator> comm = dtrain::comm::connect(env, connect);
    share_cores(env);
    const bool rank0 = comm->rank() == 0;
    if (rank0) {
      std::cout << fmt::format("dtrain-worker: {} model, {} steps, out_dir {}, {} rank(s) ({}), backend {}, "
                               "ZeRO stage {}\n",
                               config.model().kind(), config.train().steps(), config.train().out_dir(),
                               env.world_size, dtrain::cluster::starter_name(env.starter), comm->backend_name(),
                               config.parallel().zero_stage());
    }
    dtrain::worker::Trainer trainer(config, {.write_outputs = true, .console = &std::cout, .comm = comm});
    const dtrain::worker::TrainSummary summary = trainer.run();
    if (rank0) print_summary(summary);
    if (rank0 && summary.stopped_by_signal != 0) {
      std::cout << "dtrain-worker: stopped early on a signal after saving; resume with checkpoint.resume=auto\n";
    }
    return 0;
  } catch (const dtrain::TimeoutError& e) {
    std::cerr << "dtrain-worker: error: " << e.what() << std::endl;
    std::_Exit(2);  // the comm thread may be stuck inside a library call
  } catch (const dtrain::CommError& e) {
    std::cerr << "dtrain-worker: error: " << e.what() << std::endl;
    std::_Exit(2);  // the comm thread may be stuck inside a library call
  } catch (const dtrain::Error& e) {
    std::cerr << "dtrain-worker: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain-worker: unexpected error: " << e.what() << "\n";
    return 3;
  }
}
