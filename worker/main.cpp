// dtrain-worker --config FILE.json [--set a.b=v ...]: trains one model.
#include <omp.h>

#include <algorithm>
#include <functional>
#include <thread>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "cluster/environment.h"
#include "comm/connect.h"
#include "core/command_line.h"
#include "core/error.h"
#include "core/openmp_wait.h"
#include "core/plugin.h"
#include "core/process.h"
#include "telemetry/metrics_http.h"
#include "telemetry/metrics_render.h"
#include "worker/config.h"
#include "worker/heartbeat.h"
#include "worker/metrics_publisher.h"
#include "worker/signals.h"
#include "worker/trainer.h"

namespace {

void print_summary(const dtrain::worker::TrainSummary& s) {
  // This invocation's steps: a resumed run says where it went on from.
  const std::string resumed =
      s.steps_run == s.steps ? "" : fmt::format(" (steps {}-{}, resumed after step {})", s.steps - s.steps_run + 1,
                                                s.steps, s.steps - s.steps_run);
  std::cout << fmt::format("done: {} steps{} in {:.1f} s | final loss {:.4f} | {:.0f} tok/s", s.steps_run, resumed,
                           s.seconds, s.final_loss, s.tokens_per_s);
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

// --testonly-slow-rank RANK:MS -> MS when this process is RANK, else 0.
int testonly_slow_ms(const std::string& spec, int rank) {
  if (spec.empty()) return 0;
  const auto colon = spec.find(':');
  if (colon == std::string::npos) throw dtrain::Error("--testonly-slow-rank takes RANK:MS, e.g. 1:50");
  return std::stoi(spec.substr(0, colon)) == rank ? std::stoi(spec.substr(colon + 1)) : 0;
}

// This rank's own /metrics (no launcher needed): the page of one rank.
std::unique_ptr<dtrain::telemetry::MetricsServer> serve_metrics(const std::string& host, int port,
                                                                const dtrain::cluster::Environment& env,
                                                                std::shared_ptr<dtrain::worker::LiveMetrics> live) {
  if (port <= 0 || !live) return nullptr;
  auto server = std::make_unique<dtrain::telemetry::MetricsServer>(host, port + env.local_rank, [live, env] {
    dtrain::telemetry::JobMetrics job;
    job.run_id = env.run_id;
    job.world_size = env.world_size;
    job.round = env.restart;
    job.workers_up = 1;
    job.local_workers_running = 1;
    job.ranks.resize(static_cast<std::size_t>(env.world_size));
    job.ranks[static_cast<std::size_t>(env.rank)] = live->snapshot_fields();
    return dtrain::telemetry::render_prometheus(job);
  });
  std::cout << fmt::format("dtrain-worker: rank {} serves /metrics on http://{}:{}/metrics\n", env.rank, host,
                           server->port());
  return server;
}

// Ranks on one node split its cores unless OMP_NUM_THREADS says otherwise:
// several full-size OpenMP teams on the same cores spin against each other.
// dtrain-launch's torchrun-like OMP_NUM_THREADS=1 (DTRAIN_OMP_DEFAULTED) is
// not the user's choice.
void share_cores(const dtrain::cluster::Environment& env) {
  const bool chosen = std::getenv("OMP_NUM_THREADS") != nullptr && std::getenv("DTRAIN_OMP_DEFAULTED") == nullptr;
  if (chosen || env.local_world_size <= 1) return;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  omp_set_num_threads(std::max(1, cores / env.local_world_size));
}

// The command line.
struct WorkerArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  int metrics_port = 0;
  std::string metrics_host = "127.0.0.1";
  std::string slow_rank;
  std::string profile_steps;  // train.profile_steps
  bool print_config = false;  // print the resolved config and stop
  bool eval_only = false;     // score the checkpoint resumed from, train nothing
  bool dry_run = false;       // validate, plan the memory, stop
  double peak_flops = 0.0;    // one rank's peak FLOP/s, for MFU on the progress lines
};

void add_options(CLI::App& app, WorkerArgs& args) {
  app.add_option("--config", args.config_path, "training config (JSON)")->required();
  app.add_option("--set", args.overrides, "override a config field: --set train.steps=100")
      ->take_all();
  app.add_option("--metrics-port", args.metrics_port,
                 "serve Prometheus /metrics on this port plus the local rank (0: off)");
  app.add_option("--metrics-host", args.metrics_host, "the address /metrics listens on");
  app.add_flag("--print-config", args.print_config, "print the resolved, validated config as JSON and exit");
  app.add_flag("--dry-run", args.dry_run,
               "validate the config, build the model and print the memory each rank needs against the machine's; "
               "exit 0 when it fits, 2 when not (device cuda: the GPU memory each rank needs, not checked)");
  app.add_flag("--eval-only", args.eval_only,
               "score the checkpoint checkpoint.resume names on the held-out data (one eval line), train nothing");
  app.add_option("--peak-flops", args.peak_flops,
                 "one rank's peak FLOP/s (e.g. 989e12 for an H100 in bf16): progress lines then show MFU "
                 "(default: DTRAIN_PEAK_FLOPS, which dtrain-launch --peak-flops sets)");
  app.add_option("--profile-steps", args.profile_steps,
                 "profile steps of every rank as torch.profiler.schedule: \"wait=1,warmup=1,active=3\" (the same as "
                 "--set train.profile_steps=...); the trace goes to <train.tensorboard_dir>/plugins/profile");
  app.add_option("--testonly-slow-rank", args.slow_rank, "TEST ONLY: RANK:MS sleeps MS ms in each step of RANK");
}

// The trainer's communicators: `comm` for every collective, except that with
// device cuda on several ranks nccl carries the gradients in GPU memory
// (`device_comm`) and the host-side collectives (initialisation check, loss,
// stop flags, checkpoints) need a CPU backend beside it (gloo, or mpi under
// mpirun) in `comm`.
struct Communicators {
  std::shared_ptr<dtrain::comm::Communicator> comm;
  std::shared_ptr<dtrain::comm::Communicator> device_comm;
};

Communicators connect_communicators(const dtrain::config::Config& config, const dtrain::cluster::Environment& env,
                                    const dtrain::comm::OpenedStore& store, dtrain::comm::Duration timeout) {
  dtrain::comm::ConnectOptions connect;
  connect.backend = config.parallel().backend();
  connect.device = config.device();
  connect.timeout = timeout;
  connect.store = store.store;
  Communicators c;
  c.comm = dtrain::comm::connect(env, connect);
  if (config.device() == "cuda" && env.world_size > 1 && std::string_view(c.comm->backend_name()) == "nccl") {
    c.device_comm = std::move(c.comm);
    dtrain::comm::ConnectOptions host = connect;
    host.backend = "auto";
    host.device = "cpu";
    host.name = "host";
    c.comm = dtrain::comm::connect(env, host);
  }
  return c;
}

// The figures for /metrics: published for dtrain-launch (DTRAIN_METRICS,
// through the heartbeat) and/or served here (--metrics-port); null when neither.
std::shared_ptr<dtrain::worker::LiveMetrics> live_metrics(dtrain::worker::Heartbeat* heartbeat, int metrics_port,
                                                          const dtrain::cluster::Environment& env,
                                                          const std::shared_ptr<dtrain::comm::Communicator>& comm) {
  const bool publish = heartbeat != nullptr && std::getenv("DTRAIN_METRICS") != nullptr;
  if (!publish && metrics_port <= 0) return nullptr;
  auto live = std::make_shared<dtrain::worker::LiveMetrics>(env.rank, env.world_size);
  live->set_communicator(comm);
  if (publish) heartbeat->set_metrics_source([live] { return live->snapshot(); });
  return live;
}

// --peak-flops, else dtrain-launch's --peak-flops (DTRAIN_PEAK_FLOPS); 0: unknown.
double peak_flops_of(const WorkerArgs& args) {
  if (args.peak_flops > 0.0) return args.peak_flops;
  const char* set = std::getenv("DTRAIN_PEAK_FLOPS");
  if (set == nullptr || *set == '\0') return 0.0;
  char* end = nullptr;
  const double value = std::strtod(set, &end);
  if (end == set || *end != '\0' || !(value > 0.0)) {
    throw dtrain::Error(fmt::format("DTRAIN_PEAK_FLOPS='{}' is not a positive number of FLOP/s (e.g. 989e12)", set));
  }
  return value;
}

// What runs where: the device, its precision and this rank's threads (after share_cores).
void print_start(const dtrain::config::Config& config, const dtrain::cluster::Environment& env,
                 const dtrain::comm::Communicator& comm, double peak_flops) {
  const std::string device = config.device() == "cuda"
                                 ? fmt::format("cuda:{}", dtrain::comm::cuda_device_for(env))
                                 : fmt::format("cpu, {} OpenMP thread(s) per rank ({} wait)", omp_get_max_threads(),
                                               dtrain::openmp_wait_policy());
  std::cout << fmt::format("dtrain-worker: {} model, {} steps, out_dir {}, {} rank(s) ({}), backend {}, "
                           "ZeRO stage {} | device {} | precision {} | MFU {}\n",
                           config.model().kind(), config.train().steps(), config.train().out_dir(),
                           env.world_size, dtrain::cluster::starter_name(env.starter), comm.backend_name(),
                           config.parallel().zero_stage(), device, config.precision(),
                           peak_flops > 0.0 ? fmt::format("over a peak of {:g} FLOP/s", peak_flops)
                                            : std::string("not shown (--peak-flops to set the peak)"));
}

// dtrain-launch merges the ranks' traces (launcher/trace_merge.h).
void publish_trace(const dtrain::worker::Trainer& trainer, const dtrain::comm::OpenedStore& store,
                   const dtrain::cluster::Environment& env) {
  if (const auto trace = trainer.trace_file(); trace && store.store) {
    store.store->set(fmt::format("trace/{}", env.rank), dtrain::comm::to_bytes(trace->string()));
  }
}

void print_end(const dtrain::worker::TrainSummary& summary) {
  if (summary.already_finished) return;  // the trainer said so
  print_summary(summary);
  if (summary.stopped_by_signal != 0) {
    std::cout << "dtrain-worker: stopped early on a signal after saving; resume with checkpoint.resume=auto\n";
  }
}

// --dry-run: the memory plan of one rank against the machine's memory.
int dry_run(const dtrain::config::Config& config, const dtrain::cluster::Environment& env) {
  const dtrain::worker::MemoryPlan plan = dtrain::worker::plan_run(config, env.world_size);
  const std::int64_t available = dtrain::worker::available_memory_bytes();
  std::cout << dtrain::worker::describe(plan, config, env.world_size);
  std::cout << fmt::format("available        {:>10.1f} MiB on this node, for {} rank(s)\n",
                           static_cast<double>(available) / (1024.0 * 1024.0), env.local_world_size);
  dtrain::worker::check_fits(plan, available, env.local_world_size, config,
                             [&](const dtrain::config::Config& changed) {
                               return dtrain::worker::plan_run(changed, env.world_size);
                             });
  if (config.device() != "cuda") {
    std::cout << "dry run: the config is valid and the run fits\n";
    return 0;
  }
  // The GPU's share is not measured against a GPU: say so, and whether there is one.
  std::string why;
  const int gpus = dtrain::cuda_device_count(&why);
  const double gpu_mib = static_cast<double>(plan.state.model_state_bytes() + plan.state.working_bytes +
                                             plan.activation_bytes) / (1024.0 * 1024.0);
  std::cout << fmt::format("dry run: the config is valid and the host's share fits; each rank needs about {:.1f} MiB "
                           "of GPU memory, not checked against the GPU's: {}\n",
                           gpu_mib, gpus > 0 ? fmt::format("{} GPU(s) visible here", gpus)
                                             : fmt::format("no GPU visible here ({}), so whether it fits is "
                                                           "unknown",
                                                           why));
  return 0;
}

// Who this process is (dtrain-launch, mpirun, srun or alone), the run's
// store and the communicators, then the training run.
int train(const WorkerArgs& args) {
  std::vector<std::string> overrides = args.overrides;
  if (!args.profile_steps.empty()) overrides.push_back("train.profile_steps=" + args.profile_steps);
  const dtrain::config::Config config = dtrain::worker::load_config(args.config_path, overrides);
  if (args.print_config) {
    std::cout << dtrain::worker::config_to_json(config);
    return 0;
  }
  const auto env = dtrain::cluster::detect_environment(dtrain::cluster::process_environment());
  if (args.dry_run) return dry_run(config, env);
  const double peak_flops = peak_flops_of(args);
  const auto timeout = std::chrono::seconds(config.parallel().timeout_s());
  // Under dtrain-launch: step, phase and collective for its hang detection.
  const auto heartbeat = dtrain::worker::Heartbeat::from_environment(env, dtrain::cluster::process_environment());
  // Under srun without DTRAIN_TOKEN, rank 0 hands the others a random token
  // through a file in out_dir, which every node sees.
  dtrain::comm::OpenedStore store = dtrain::comm::open_store(env, timeout, config.train().out_dir());
  const auto [comm, device_comm] = connect_communicators(config, env, store, timeout);
  if (heartbeat) heartbeat->set_communicator(comm);
  const auto live = live_metrics(heartbeat.get(), args.metrics_port, env, comm);
  const auto metrics_server = serve_metrics(args.metrics_host, args.metrics_port, env, live);
  share_cores(env);
  const bool rank0 = comm->rank() == 0;
  if (rank0) print_start(config, env, *comm, peak_flops);
  dtrain::worker::Trainer trainer(config, {.write_outputs = true, .console = &std::cout, .comm = comm,
                                                       .device_comm = device_comm,
                                                       .cuda_device = config.device() == "cuda"
                                                                          ? dtrain::comm::cuda_device_for(env)
                                                                          : 0,
                                                       .ranks_on_node = env.local_world_size,
                                                       .heartbeat = heartbeat.get(), .restart = env.restart,
                                                       .eval_only = args.eval_only,
                                                       .peak_flops = peak_flops,
                                                       .live_metrics = live.get(),
                                                       .testonly_slow_ms = testonly_slow_ms(args.slow_rank, env.rank)});
  if (args.eval_only) {
    trainer.evaluate_checkpoint();
    return 0;
  }
  const dtrain::worker::TrainSummary summary = trainer.run();
  if (live) live->set_communicator(nullptr);  // the heartbeat's last publication keeps the final totals
  publish_trace(trainer, store, env);
  if (rank0) print_end(summary);
  return 0;
}

}  // namespace

// Exit codes (core/exit_codes.h): a usage error or a dtrain::Error 2, an
// unexpected one 3; a failed collective may leave a comm thread that never
// returns, hence an exit at once (core/command_line.h: run_main).
int main(int argc, char** argv) {
  dtrain::choose_openmp_wait_policy(argv);  // first: it may execute the program again
  return dtrain::run_main(
      "dtrain-worker",
      [&] {
        dtrain::configure_malloc_for_training();
        dtrain::worker::install_stop_signals();
        CLI::App app{"dtrain-worker: one rank of a dtrain training job"};
        WorkerArgs args;
        add_options(app, args);
        if (const auto code = dtrain::parse_args(app, argc, argv, "dtrain-worker")) return *code;
        return train(args);
      },
      /*comm_errors_exit_at_once=*/true);
}
