#include "tools/bench_train.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cluster/environment.h"
#include "comm/connect.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/openmp_wait.h"
#include "core/process.h"
#include "nn/cpu/host_device.h"
#include "nn/cpu/isa.h"
#include "nn/cpu/kernel_profile.h"
#include "nn/cpu/matmul.h"
#include "tools/bench_profile.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::tools {
namespace {

// This process's place in the job. A single process trains alone (the
// trainer makes its own world of one); ranks started by mpirun, srun or
// dtrain-launch connect the configured backend first.
struct World {
  cluster::Environment env;
  comm::OpenedStore store;  // kept for the whole run: rank 0 may host the server
  std::shared_ptr<comm::Communicator> comm;
};

World join_world(const config::Config& config) {
  World w;
  w.env = cluster::detect_environment(cluster::process_environment());
  if (w.env.world_size <= 1) return w;
  const comm::Duration timeout = std::chrono::seconds(config.parallel().timeout_s());
  w.store = comm::open_store(w.env, timeout);
  comm::ConnectOptions options;
  options.backend = comm::resolve_backend(config.parallel().backend(), "cpu", w.env);
  options.timeout = timeout;
  options.name = "train";
  options.store = w.store.store;
  w.comm = comm::connect(w.env, options);
  return w;
}

// What the timed steps measured on this rank (step seconds: the slowest
// rank's once reduced).
struct Timing {
  std::vector<double> seconds;
  double own_seconds = 0.0;      // this rank's steps, summed (before take_slowest)
  double comm_seconds = 0.0;     // summed over the timed steps
  double exposed_seconds = 0.0;
  double hidden_share = 0.0;     // summed; mean = / steps
  long faults = 0;
};

// profile: the host device's kernels are timed into it over the timed steps only.
Timing time_steps(worker::Trainer& trainer, const TrainBenchOptions& options, nn::cpu::KernelProfile* profile) {
  for (int i = 0; i < options.warmup; ++i) trainer.step();
  auto* host = profile != nullptr ? dynamic_cast<nn::cpu::HostDevice*>(&trainer.device()) : nullptr;
  if (host != nullptr) host->set_profile(profile);
  Timing t;
  const long faults_before = minor_page_faults();
  for (int i = 0; i < options.steps; ++i) {
    t.seconds.push_back(trainer.step().seconds);
    t.own_seconds += t.seconds.back();
    const sharding::CommStats& c = trainer.engine().comm_stats();
    t.comm_seconds += c.comm_seconds;
    t.exposed_seconds += c.exposed_seconds;
    t.hidden_share += c.hidden_share();
  }
  t.faults = minor_page_faults() - faults_before;
  if (host != nullptr) {
    host->set_profile(nullptr);
    host->synchronize();  // a queued device's timings are complete once its queue ran
  }
  return t;
}

// A data-parallel step ends when its slowest rank's does: every rank gets,
// step by step, the longest time any rank measured (ranks enter and leave a
// step at different moments).
void take_slowest(std::vector<double>& seconds, comm::Communicator* comm) {
  if (comm == nullptr || comm->world_size() == 1) return;
  std::vector<float> s(seconds.begin(), seconds.end());
  comm->allreduce(s.data(), s.size(), DType::f32, comm::ReduceOp::max).wait();
  std::copy(s.begin(), s.end(), seconds.begin());
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// device cuda: what MFU divides by, in GFLOP/s, and where the figure comes
// from. The defaults are NVIDIA's dense figures for H100 SXM / H200 (tensor
// cores for bf16 and fp16; fp32 runs without TF32, on the CUDA cores).
struct GpuPeak {
  double gflops = 0.0;
  std::string source;
};

GpuPeak gpu_peak(const config::Config& config, const TrainBenchOptions& o) {
  if (o.peak_flops > 0.0) return {o.peak_flops / 1e9, "--peak-flops"};
  if (config.precision() == "fp32") return {67e3, "H100/H200 fp32 (67e12; --peak-flops for another GPU)"};
  return {989e3, fmt::format("H100/H200 dense {} (989e12; --peak-flops for another GPU)", config.precision())};
}

// The device figures that replace the host engine's (which only mirrors the
// state for checkpoints on this path).
void print_device_lines(worker::Trainer& trainer, const World& w, const GpuPeak& peak) {
  std::cout << fmt::format("device: cuda\n");
  std::cout << fmt::format("peak_gflops: {:.1f}\n", peak.gflops);
  std::cout << fmt::format("peak_source: {}\n", peak.source);
  std::cout << fmt::format("device_mb: {:.1f}\n", mib(trainer.device_bytes()));
  std::cout << fmt::format("world_size: {}\n", w.env.world_size);
  std::cout << fmt::format("param_count: {}\n", trainer.layout().total_numel());
}

std::string reproduce_command(const TrainBenchOptions& o, const World& w) {
  std::string prefix = fmt::format("OMP_NUM_THREADS={} ", omp_get_max_threads());
  if (w.env.starter == cluster::Starter::mpirun) {
    prefix += fmt::format("mpirun -np {} ", w.env.world_size);
    if (w.env.store) prefix += fmt::format("-x DTRAIN_STORE={} ", *w.env.store);
  } else if (w.env.starter == cluster::Starter::slurm) {
    prefix += fmt::format("srun -n {} ", w.env.world_size);
  } else if (w.env.starter == cluster::Starter::launcher || w.env.starter == cluster::Starter::torchrun) {
    const bool launcher = w.env.starter == cluster::Starter::launcher;
    prefix += fmt::format("{} --nnodes {} --nproc-per-node {} {}", launcher ? "dtrain-launch" : "torchrun --no-python",
                          w.env.world_size / std::max(w.env.local_world_size, 1), w.env.local_world_size,
                          launcher ? "-- " : "");
  }
  std::string cmd = fmt::format("{}dtrain-bench train --config {} --steps {}", prefix,
                                o.config_path, o.steps);
  if (o.peak_flops > 0.0) cmd += fmt::format(" --peak-flops {:g}", o.peak_flops);
  if (o.profile) cmd += " --profile";
  for (const std::string& s : o.overrides) cmd += " --set " + s;
  return cmd;
}


// The data-parallel figures (added after the single-process ones).
void print_parallel_lines(worker::Trainer& trainer, const World& w, const Timing& t,
                          double per_rank_tokens_per_s) {
  const sharding::MemoryStats& m = trainer.engine().memory();
  const double steps = static_cast<double>(t.seconds.size());
  std::cout << fmt::format("world_size: {}\n", w.env.world_size);
  std::cout << fmt::format("backend: {}\n", trainer.communicator().backend_name());
  std::cout << fmt::format("zero_stage: {}\n", trainer.engine().stage());
  std::cout << fmt::format("tokens_per_s_per_rank: {:.1f}\n", per_rank_tokens_per_s);
  std::cout << fmt::format("comm_ms_per_step: {:.3f}\n", 1e3 * t.comm_seconds / steps);
  std::cout << fmt::format("exposed_comm_ms_per_step: {:.3f}\n", 1e3 * t.exposed_seconds / steps);
  std::cout << fmt::format("comm_hidden_share: {:.3f}\n", t.hidden_share / steps);
  std::cout << fmt::format("param_count: {}\n", trainer.layout().total_numel());
  std::cout << fmt::format("param_mb: {:.3f}\n", mib(m.param_bytes));
  std::cout << fmt::format("grad_mb: {:.3f}\n", mib(m.grad_bytes));
  std::cout << fmt::format("optimizer_mb: {:.3f}\n", mib(m.optimizer_bytes));
  std::cout << fmt::format("working_mb: {:.3f}\n", mib(m.working_bytes));
  std::cout << fmt::format("model_state_mb: {:.3f}\n", mib(m.model_state_bytes()));
  std::cout << fmt::format("model_state_bytes: {}\n", m.model_state_bytes());
  std::cout << fmt::format("working_bytes: {}\n", m.working_bytes);
}

// The step-time figures of the timed steps, over all ranks.
struct Throughput {
  int ranks = 1;
  double tokens = 0.0;        // per step, all ranks
  double mean_s = 0.0, median_s = 0.0, best_s = 0.0;
  double tokens_per_s = 0.0;  // from the mean step, all ranks
  double gflops = 0.0;
  double mfu = 0.0;           // per rank, against each rank's own GEMM peak
};

Throughput summarise(std::vector<double> seconds, double tokens, int ranks,
                     double flops_per_token, double peak) {
  Throughput r;
  r.ranks = ranks;
  r.tokens = tokens;
  double total = 0.0;
  for (double s : seconds) total += s;
  std::sort(seconds.begin(), seconds.end());
  r.mean_s = total / static_cast<double>(seconds.size());
  r.median_s = seconds[seconds.size() / 2];
  r.best_s = seconds.front();
  r.tokens_per_s = tokens / r.mean_s;
  r.gflops = flops_per_token * r.tokens_per_s / 1e9;
  r.mfu = r.gflops / (peak * ranks);
  return r;
}

void print_throughput(const TrainBenchOptions& o, const config::Config& config,
                      worker::Trainer& trainer, const World& w, const Throughput& r) {
  const nn::ModelConfig& model = trainer.model();
  const double flops_per_token = model.flops_per_token(trainer.seq_len());
  std::cout << fmt::format(
      "dtrain-bench train: {} ({} model, {:.2f}M matmul params, {:.1f} MFLOP/token, "
      "micro-batch {} x {} tokens, {})\n",
      o.config_path, config.model().kind(), static_cast<double>(model.matmul_params()) / 1e6,
      flops_per_token / 1e6, config.train().micro_batch_size(), trainer.seq_len(),
      trainer.on_device() ? fmt::format("device cuda, {}", config.precision())
                          : fmt::format("{} thread(s)", omp_get_max_threads()));
  std::cout << fmt::format("cpu: {}\n", nn::cpu::cpu_summary());
  if (r.ranks > 1) {
    std::cout << fmt::format("{} ranks ({}), backend {}, ZeRO stage {}; tokens count all "
                             "ranks, mfu is per rank\n",
                             r.ranks, cluster::starter_name(w.env.starter),
                             trainer.communicator().backend_name(),
                             trainer.engine().stage());
  }
  std::cout << fmt::format("{:>6} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>7}\n", "steps",
                           "tokens/step", "mean ms", "median ms", "best ms", "tokens/s",
                           "GFLOP/s", "mfu");
  std::cout << fmt::format("{:>6} {:>12.0f} {:>12.2f} {:>12.2f} {:>12.2f} {:>10.0f} {:>10.1f} "
                           "{:>7.3f}\n",
                           o.steps, r.tokens, 1e3 * r.mean_s, 1e3 * r.median_s, 1e3 * r.best_s,
                           r.tokens_per_s, r.gflops, r.mfu);
  std::cout << fmt::format("tokens_per_s: {:.1f}\n", r.tokens_per_s);
  std::cout << fmt::format("step_ms: {:.3f}\n", 1e3 * r.mean_s);
  std::cout << fmt::format("mfu: {:.4f}\n", r.mfu);
  std::cout << fmt::format("achieved_gflops: {:.2f}\n", r.gflops);
}

}  // namespace

int run_train_bench(const TrainBenchOptions& options) {
  config::Config config = worker::load_config(options.config_path, options.overrides);
  // Enough steps that the schedule never ends inside the measurement.
  config.mutable_train()->set_steps(options.warmup + options.steps + 1);
  const World world = join_world(config);
  worker::Trainer trainer(config, {.write_outputs = false, .console = nullptr,
                                   .comm = world.comm});
  // The dataset's sequence length (e.g. patches per image), not the config's.
  const double flops_per_token = trainer.model().flops_per_token(trainer.seq_len());
  const bool cuda = trainer.on_device();
  if (options.profile && dynamic_cast<nn::cpu::HostDevice*>(&trainer.device()) == nullptr) {
    throw Error(fmt::format("--profile times the CPU's kernels; this run is on {} (use the GPU's own profiler, "
                            "e.g. nsys)", trainer.device().name()));
  }
  const GpuPeak gpu = cuda ? gpu_peak(config, options) : GpuPeak{};
  // The CPU's peak: the better of a measurement before the steps and one
  // after (every rank measures both, as it trains), so that one disturbed
  // second cannot lower it and lift MFU.
  const auto cpu_peak = [&] { return nn::cpu::measure_gemm_peak_gflops(2048, options.peak_seconds); };
  double peak = cuda ? gpu.gflops : cpu_peak();

  nn::cpu::KernelProfile profile;
  Timing t = time_steps(trainer, options, options.profile ? &profile : nullptr);
  if (!cuda) peak = std::max(peak, cpu_peak());
  take_slowest(t.seconds, world.comm.get());
  if (world.env.rank != 0) return 0;
  const int ranks = world.env.world_size;
  // tokens_per_step() counts every rank's micro-batches (each trains its own).
  const auto tokens = static_cast<double>(trainer.tokens_per_step());
  const Throughput r = summarise(t.seconds, tokens, ranks, flops_per_token, peak);

  print_throughput(options, config, trainer, world, r);
  if (!cuda) std::cout << fmt::format("gemm_peak_gflops: {:.2f}\n", peak);
  std::cout << fmt::format("flops_per_token: {:.0f}\n", flops_per_token);
  std::cout << fmt::format("page_faults_per_step: {:.1f}\n",
                           static_cast<double>(t.faults) / options.steps);
  std::cout << fmt::format("peak_rss_mb: {:.1f}\n", peak_rss_mb());
  std::cout << fmt::format("threads: {}\n", omp_get_max_threads());
  std::cout << fmt::format("omp_wait_policy: {}\n", openmp_wait_policy());
  std::cout << fmt::format("cpu_model: {}\n", cpu_model_name());
  std::cout << fmt::format("cpu_isa: {}\n", nn::cpu::cpu_isa_name());
  if (!cuda) std::cout << fmt::format("gemm_kernel: {}\n", nn::cpu::gemm_kernel_name());
  if (cuda) {
    print_device_lines(trainer, world, gpu);
  } else {
    print_parallel_lines(trainer, world, t, r.tokens_per_s / ranks);
  }
  if (options.profile) {
    print_profile(profile,
                  {.steps = options.steps,
                   .step_seconds = t.own_seconds,
                   .gemm_peak_gflops = peak,
                   .model_flops = flops_per_token * tokens / ranks},
                  std::cout);
  }
  std::cout << "command: " << reproduce_command(options, world) << "\n" << std::flush;
  return 0;
}

}  // namespace dtrain::tools
