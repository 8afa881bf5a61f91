#include "tools/bench_collectives.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include <fmt/format.h>

#include "cluster/environment.h"
#include "comm/connect.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/process.h"
#include "nn/cuda_device.h"
#include "tools/bench_collectives_common.h"
#include "tools/bench_collectives_data.h"

namespace dtrain::tools {
namespace {

using comm::OpKind;
using comm::ReduceOp;

OpKind parse_collective(const std::string& name) {
  if (name == "allreduce") return OpKind::allreduce;
  if (name == "reduce_scatter") return OpKind::reduce_scatter;
  if (name == "allgather") return OpKind::allgather;
  if (name == "broadcast") return OpKind::broadcast;
  throw ConfigError("collective", fmt::format("'{}' is not allreduce, reduce_scatter, allgather "
                                              "or broadcast", name));
}

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  throw ConfigError("--dtype", fmt::format("'{}' is not f32, bf16 or f16", name));
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg") return ReduceOp::avg;
  if (name == "max") return ReduceOp::max;
  throw ConfigError("--op", fmt::format("'{}' is not sum, avg or max", name));
}

void validate(const CollectiveBenchOptions& o) {
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) {
    throw ConfigError("--min-bytes", fmt::format("need 0 < min-bytes ({}) <= max-bytes ({})",
                                                 o.min_bytes, o.max_bytes));
  }
  if (o.step_factor <= 1.0 && o.min_bytes != o.max_bytes) {
    throw ConfigError("--step-factor", fmt::format("{} must be > 1", o.step_factor));
  }
  if (o.iters < 1) throw ConfigError("--iters", "must be at least 1");
  if (o.warmup < 0) throw ConfigError("--warmup", "must be >= 0");
  if (o.timeout_s < 1) throw ConfigError("--timeout-s", "must be at least 1");
}

// The layouts of the sweep, skipping sizes too small for one element per
// rank and sizes that round to the one before.
std::vector<Layout> sweep_layouts(const CollectiveBenchOptions& o, OpKind kind, DType dtype,
                                  int world_size) {
  std::vector<Layout> layouts;
  for (std::size_t bytes : sweep_sizes(o.min_bytes, o.max_bytes, o.step_factor)) {
    const Layout l = make_layout(kind, bytes, dtype_size(dtype), world_size);
    if (l.count == 0 || (!layouts.empty() && layouts.back().bytes == l.bytes)) continue;
    layouts.push_back(l);
  }
  if (layouts.empty()) {
    throw ConfigError("--max-bytes", fmt::format("{} B holds less than one {} element per rank "
                                                 "for {} ranks", o.max_bytes, dtype_name(dtype),
                                                 world_size));
  }
  return layouts;
}

// Times and checks one collective at each size on one communicator.
class CollectiveBench {
 public:
  CollectiveBench(comm::Communicator& comm, const CollectiveBenchOptions& options,
                  const Layout& largest, nn::Device* device)
      : comm_(comm),
        options_(options),
        pattern_{parse_collective(options.collective), parse_dtype(options.dtype),
                 parse_op(options.op), options.root, comm.rank(), comm.world_size()},
        input_(largest.in_elems * dtype_size(pattern_.dtype), device),
        output_(largest.out_elems * dtype_size(pattern_.dtype), device),
        scalar_(sizeof(float), device) {}

  // The most page faults per timed operation at any size so far, over ranks.
  double max_faults_per_op() {
    return reduce_scalar(static_cast<float>(max_faults_per_op_), ReduceOp::max);
  }

  BenchRow run_size(const Layout& l) {
    const double local_us = time_us(l);
    const std::int64_t local_wrong = check(l);
    // The slowest rank bounds the collective; errors anywhere count.
    const double us = reduce_scalar(static_cast<float>(local_us), ReduceOp::max);
    const auto wrong = static_cast<std::int64_t>(
        reduce_scalar(static_cast<float>(local_wrong), ReduceOp::sum));
    const bool reduces = pattern_.kind == OpKind::allreduce ||
                         pattern_.kind == OpKind::reduce_scatter;
    const std::string_view redop = reduces ? std::string_view(options_.op) : "none";
    return make_row(l.bytes, l.count, dtype_name(pattern_.dtype), redop, us,
                    bus_factor(options_.collective, comm_.world_size()), wrong);
  }

 private:
  comm::Work issue(const Layout& l) {
    switch (pattern_.kind) {
      case OpKind::allreduce:
        return comm_.allreduce(input_.data(), l.count, pattern_.dtype, pattern_.op);
      case OpKind::reduce_scatter:
        return comm_.reduce_scatter(input_.data(), output_.data(), l.count, pattern_.dtype,
                                    pattern_.op);
      case OpKind::allgather:
        return comm_.allgather(input_.data(), output_.data(), l.count, pattern_.dtype);
      case OpKind::broadcast:
        return comm_.broadcast(input_.data(), l.count, pattern_.dtype, pattern_.root);
      case OpKind::barrier:
        break;
    }
    throw Error("dtrain-bench: barrier is not a benchmarked collective");
  }

  // Mean wall time of one operation, each waited for before the next starts,
  // over `iters` back-to-back operations that all ranks start together.
  // Also records the page faults per timed operation: fresh memory in the
  // hot path is the usual reason a large size falls short of the baseline.
  double time_us(const Layout& l) {
    for (int i = 0; i < options_.warmup; ++i) issue(l).wait();
    comm_.barrier().wait();
    const long faults_before = minor_page_faults();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options_.iters; ++i) issue(l).wait();
    const auto elapsed = std::chrono::steady_clock::now() - start;
    const double faults = static_cast<double>(minor_page_faults() - faults_before) / options_.iters;
    max_faults_per_op_ = std::max(max_faults_per_op_, faults);
    return std::chrono::duration<double, std::micro>(elapsed).count() / options_.iters;
  }

  // Runs the operation once on freshly filled buffers and counts this rank's
  // wrong result elements. The output starts as a value no rank sends, so an
  // operation that writes nothing cannot pass on the timed runs' results.
  std::int64_t check(const Layout& l) {
    fill_input(pattern_, l, input_.host());
    input_.to_device(l.in_elems * dtype_size(pattern_.dtype));
    if (l.out_elems > 0) {
      fill_value(pattern_.dtype, output_.host(), l.out_elems, kUnwritten);
      output_.to_device(l.out_elems * dtype_size(pattern_.dtype));
    }
    issue(l).wait();
    BenchBuffer& result = l.out_elems > 0 ? output_ : input_;
    const std::size_t elems = l.out_elems > 0 ? l.out_elems : l.in_elems;
    result.to_host(elems * dtype_size(pattern_.dtype));
    return count_wrong(pattern_, l, result.host());
  }

  // One float reduced over ranks; f32 keeps counts exact up to 2^24.
  float reduce_scalar(float value, ReduceOp op) {
    std::memcpy(scalar_.host(), &value, sizeof value);
    scalar_.to_device(sizeof value);
    comm_.allreduce(scalar_.data(), 1, DType::f32, op).wait();
    scalar_.to_host(sizeof value);
    std::memcpy(&value, scalar_.host(), sizeof value);
    return value;
  }

  static constexpr float kUnwritten = -1.0f;

  comm::Communicator& comm_;
  const CollectiveBenchOptions& options_;
  Pattern pattern_;
  BenchBuffer input_;
  BenchBuffer output_;
  BenchBuffer scalar_;
  double max_faults_per_op_ = 0.0;
};

// The shell line that runs this benchmark again the same way.
std::string reproduce_command(const CollectiveBenchOptions& o, const cluster::Environment& env,
                              const std::string& backend) {
  std::string prefix;
  if (env.store && env.starter != cluster::Starter::launcher && env.starter != cluster::Starter::torchrun) {
    prefix = fmt::format("DTRAIN_STORE={} ", *env.store);
  }
  switch (env.starter) {
    case cluster::Starter::mpirun:
      prefix += fmt::format("mpirun -np {}{} ", env.world_size,
                            env.store ? " -x DTRAIN_STORE" : "");
      break;
    case cluster::Starter::slurm: prefix += fmt::format("srun -n {} ", env.world_size); break;
    case cluster::Starter::launcher:
      prefix += fmt::format("dtrain-launch --nnodes {} --nproc-per-node {} -- ",
                            env.world_size / std::max(env.local_world_size, 1),
                            env.local_world_size);
      break;
    case cluster::Starter::torchrun:
      prefix += fmt::format("torchrun --no-python --nnodes {} --nproc-per-node {} ",
                            env.world_size / std::max(env.local_world_size, 1), env.local_world_size);
      break;
    case cluster::Starter::single: break;
  }
  std::string command = fmt::format(
      "{}dtrain-bench {} --backend {} --min-bytes {} --max-bytes {} --step-factor {} --iters {} "
      "--warmup {} --dtype {} --op {}",
      prefix, o.collective, backend, o.min_bytes, o.max_bytes, o.step_factor, o.iters, o.warmup,
      o.dtype, o.op);
  if (o.collective == "broadcast") command += fmt::format(" --root {}", o.root);
  return command;
}

void print_header(const CollectiveBenchOptions& o, const cluster::Environment& env,
                  const comm::Communicator& comm) {
  std::string root;
  if (o.collective == "broadcast") root = fmt::format(", root {}", o.root);
  std::cout << fmt::format("# dtrain-bench {}: backend {}, world size {} ({}), dtype {}, op {}{}\n",
                           o.collective, comm.backend_name(), comm.world_size(),
                           cluster::starter_name(env.starter), o.dtype, o.op, root);
  std::cout << fmt::format("# cpu: {}\n", cpu_model_name());
  std::cout << fmt::format("# {} timed operations per size after {} warm-up, each waited for; "
                           "time is the slowest rank's mean\n#\n",
                           o.iters, o.warmup);
  std::cout << table_header() << std::flush;
}

}  // namespace

int run_collective_bench(const CollectiveBenchOptions& options) {
  validate(options);
  const OpKind kind = parse_collective(options.collective);
  const DType dtype = parse_dtype(options.dtype);
  parse_op(options.op);
  const cluster::Environment env = cluster::detect_environment(cluster::process_environment());
  if (kind == OpKind::broadcast && (options.root < 0 || options.root >= env.world_size)) {
    throw ConfigError("--root", fmt::format("{} is not a rank of {}", options.root,
                                            env.world_size));
  }
  const std::vector<Layout> layouts = sweep_layouts(options, kind, dtype, env.world_size);

  const comm::Duration timeout = std::chrono::seconds(options.timeout_s);
  const bool on_device = options.backend == "nccl";
  const std::string backend = comm::resolve_backend(options.backend,
                                                    on_device ? "cuda" : "cpu", env);
  // nccl moves GPU memory: the buffers live on this rank's GPU (the CUDA plugin's device).
  const std::unique_ptr<nn::Device> device =
      on_device ? nn::make_cuda_device(comm::cuda_device_for(env, "--backend"), std::chrono::milliseconds(timeout))
                : nullptr;
  // gloo and nccl rendezvous through the run's store (hosted by rank 0 when
  // no launcher hosts it); mpi runs without one when DTRAIN_STORE is unset.
  const comm::OpenedStore opened = comm::open_store(env, timeout);
  comm::ConnectOptions connect_options;
  connect_options.backend = backend;
  connect_options.device = on_device ? "cuda" : "cpu";
  connect_options.timeout = timeout;
  connect_options.name = "bench";
  connect_options.store = opened.store;
  const std::unique_ptr<comm::Communicator> comm = comm::connect(env, connect_options);

  const Layout& largest = *std::max_element(
      layouts.begin(), layouts.end(),
      [](const Layout& a, const Layout& b) { return a.bytes < b.bytes; });
  CollectiveBench bench(*comm, options, largest, device.get());
  const bool prints = comm->rank() == 0;
  if (prints) print_header(options, env, *comm);
  BenchSummary summary;
  for (const Layout& l : layouts) {
    const BenchRow row = bench.run_size(l);
    summary.add(row);
    if (prints) std::cout << format_row(row) << std::flush;
  }
  const double faults = bench.max_faults_per_op();
  if (prints) {
    std::cout << summary.lines(comm->backend_name(), comm->world_size());
    std::cout << fmt::format("collective: {}\ndtype: {}\n", options.collective, options.dtype);
    std::cout << fmt::format("page_faults_per_op_max: {:.1f}\npeak_rss_mb: {:.1f}\n", faults,
                             peak_rss_mb());
    std::cout << "command: " << reproduce_command(options, env, backend) << "\n" << std::flush;
  }
  // Every rank returns the same code: the totals were reduced over all ranks.
  return summary.wrong_total() == 0 ? 0 : 1;
}

}  // namespace dtrain::tools
