// dtrain-bench-raw: the libraries dtrain's CPU backends wrap, called
// directly, as the baseline for `dtrain-bench allreduce`
// (bench/compare-collectives.sh). fp32 sum only; the same sizes, buffer
// reuse, pattern check and table as dtrain-bench.
//   mpirun -np 2 dtrain-bench-raw mpi allreduce [--min-bytes 8] [--max-bytes 64M]
//       [--step-factor 2] [--iters 20] [--warmup 5]
//   mpirun -np 2 dtrain-bench-raw gloo allreduce --store-dir DIR [...]
// gloo takes its rank and size from mpirun's OMPI_COMM_WORLD_RANK/SIZE (or
// DTRAIN_RANK/DTRAIN_WORLD_SIZE) without initialising MPI, and meets its
// peers through a gloo FileStore in DIR (a fresh directory per run).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "core/aligned_buffer.h"
#include "core/command_line.h"
#include "core/process.h"
#include "tools/bench_collectives_common.h"

namespace {

using dtrain::tools::BenchRow;

struct Options {
  std::string library;  // mpi | gloo
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  double step_factor = 2.0;
  int iters = 20;
  int warmup = 5;
  std::string store_dir;  // gloo
  int timeout_s = 300;
};

// An allreduce of floats and what the benchmark needs around it.
class Library {
 public:
  virtual ~Library() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual void allreduce_sum(float* data, std::size_t count) = 0;
  virtual void barrier() = 0;
  virtual double reduce_max(double value) = 0;
  virtual double reduce_sum(double value) = 0;
};

// Throws with MPI's own error text and the call site.
#define RAW_MPI_CHECK(call)                                                              \
  do {                                                                                   \
    const int raw_mpi_status_ = (call);                                                  \
    if (raw_mpi_status_ != MPI_SUCCESS) {                                                \
      char raw_mpi_text_[MPI_MAX_ERROR_STRING];                                          \
      int raw_mpi_len_ = 0;                                                              \
      MPI_Error_string(raw_mpi_status_, raw_mpi_text_, &raw_mpi_len_);                   \
      throw std::runtime_error(fmt::format("{} failed at {}:{}: {}", #call, __FILE__,    \
                                           __LINE__, std::string(raw_mpi_text_, raw_mpi_len_))); \
    }                                                                                    \
  } while (0)

class MpiLibrary : public Library {
 public:
  MpiLibrary() {
    RAW_MPI_CHECK(MPI_Init(nullptr, nullptr));
    RAW_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    RAW_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    RAW_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  }
  ~MpiLibrary() override { MPI_Finalize(); }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  void allreduce_sum(float* data, std::size_t count) override {
    RAW_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                                MPI_COMM_WORLD));
  }
  void barrier() override { RAW_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }
  double reduce_max(double value) override { return reduce(value, MPI_MAX); }
  double reduce_sum(double value) override { return reduce(value, MPI_SUM); }

 private:
  double reduce(double value, MPI_Op op) {
    RAW_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, op, MPI_COMM_WORLD));
    return value;
  }

  int rank_ = 0;
  int size_ = 1;
};

int env_int(const char* primary, const char* fallback) {
  const char* value = std::getenv(primary);
  if (value == nullptr) value = std::getenv(fallback);
  if (value == nullptr) {
    throw std::runtime_error(fmt::format("set {} or {} (run under mpirun)", primary, fallback));
  }
  return std::stoi(value);
}

class GlooLibrary : public Library {
 public:
  GlooLibrary(const std::string& store_dir, std::chrono::milliseconds timeout)
      : rank_(env_int("OMPI_COMM_WORLD_RANK", "DTRAIN_RANK")),
        size_(env_int("OMPI_COMM_WORLD_SIZE", "DTRAIN_WORLD_SIZE")) {
    if (store_dir.empty()) throw std::runtime_error("gloo needs --store-dir DIR");
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(store_dir);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    context_ = std::move(context);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  void allreduce_sum(float* data, std::size_t count) override {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo::allreduce(opts);
  }
  void barrier() override {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  }
  double reduce_max(double value) override {
    return reduce(value, static_cast<void (*)(void*, const void*, const void*, size_t)>(
                             &gloo::max<double>));
  }
  double reduce_sum(double value) override {
    return reduce(value, static_cast<void (*)(void*, const void*, const void*, size_t)>(
                             &gloo::sum<double>));
  }

 private:
  double reduce(double value, gloo::AllreduceOptions::Func fn) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(&value, 1);
    opts.setReduceFunction(std::move(fn));
    gloo::allreduce(opts);
    return value;
  }

  int rank_;
  int size_;
  std::shared_ptr<gloo::Context> context_;
};

// Time and correctness at one size, as dtrain-bench measures them; raises
// `max_faults` to this size's page faults per timed operation.
BenchRow run_size(Library& lib, const Options& o, float* data, std::size_t count,
                  double& max_faults) {
  for (int i = 0; i < o.warmup; ++i) lib.allreduce_sum(data, count);
  lib.barrier();
  const long faults_before = dtrain::minor_page_faults();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) lib.allreduce_sum(data, count);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const double us = std::chrono::duration<double, std::micro>(elapsed).count() / o.iters;
  max_faults = std::max(max_faults,
                        static_cast<double>(dtrain::minor_page_faults() - faults_before) / o.iters);

  using dtrain::tools::pattern_value;
  for (std::size_t i = 0; i < count; ++i) data[i] = pattern_value(lib.rank(), i, false);
  lib.allreduce_sum(data, count);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    float expected = 0.0f;
    for (int q = 0; q < lib.world_size(); ++q) expected += pattern_value(q, i, false);
    if (data[i] != expected) ++wrong;
  }
  const double wrong_total = lib.reduce_sum(static_cast<double>(wrong));
  return dtrain::tools::make_row(count * sizeof(float), count, "f32", "sum", lib.reduce_max(us),
                                 dtrain::tools::bus_factor("allreduce", lib.world_size()),
                                 static_cast<std::int64_t>(wrong_total));
}

int run(Library& lib, const Options& o) {
  dtrain::AlignedBuffer<float> data(o.max_bytes / sizeof(float));  // touched once, reused
  const bool prints = lib.rank() == 0;
  if (prints) {
    std::cout << fmt::format("# dtrain-bench-raw allreduce: library {}, world size {}, dtype f32, "
                             "op sum\n# {} timed operations per size after {} warm-up; time is "
                             "the slowest rank's mean\n#\n",
                             o.library, lib.world_size(), o.iters, o.warmup);
    std::cout << dtrain::tools::table_header() << std::flush;
  }
  dtrain::tools::BenchSummary summary;
  std::size_t last = 0;
  double max_faults = 0.0;
  for (std::size_t bytes : dtrain::tools::sweep_sizes(o.min_bytes, o.max_bytes, o.step_factor)) {
    const std::size_t count = bytes / sizeof(float);
    if (count == 0 || count == last) continue;
    last = count;
    const BenchRow row = run_size(lib, o, data.data(), count, max_faults);
    summary.add(row);
    if (prints) std::cout << dtrain::tools::format_row(row) << std::flush;
  }
  max_faults = lib.reduce_max(max_faults);
  if (prints) {
    std::cout << summary.lines(o.library, lib.world_size());
    std::cout << "collective: allreduce\ndtype: f32\n";
    std::cout << fmt::format("page_faults_per_op_max: {:.1f}\npeak_rss_mb: {:.1f}\n", max_faults,
                             dtrain::peak_rss_mb());
    std::cout << fmt::format("command: mpirun -np {} dtrain-bench-raw {} allreduce --min-bytes {} "
                             "--max-bytes {} --step-factor {} --iters {} --warmup {}{}\n",
                             lib.world_size(), o.library, o.min_bytes, o.max_bytes,
                             o.step_factor, o.iters, o.warmup,
                             o.library == "gloo" ? " --store-dir DIR" : "")
              << std::flush;
  }
  return summary.wrong_total() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::configure_malloc_for_training();  // the same malloc policy as dtrain's binaries
  CLI::App app{"dtrain-bench-raw: MPI and Gloo allreduce called directly (baseline)"};
  Options o;
  std::string collective;
  app.add_option("library", o.library, "mpi | gloo")
      ->required()->check(CLI::IsMember({"mpi", "gloo"}));
  app.add_option("collective", collective, "allreduce")
      ->required()->check(CLI::IsMember({"allreduce"}));
  app.add_option("--min-bytes", o.min_bytes)->transform(CLI::AsSizeValue(false));
  app.add_option("--max-bytes", o.max_bytes)->transform(CLI::AsSizeValue(false));
  app.add_option("--step-factor", o.step_factor)->check(CLI::Range(1.0001, 1e6));
  app.add_option("--iters", o.iters)->check(dtrain::at_least(1));
  app.add_option("--warmup", o.warmup)->check(dtrain::at_least(0));
  app.add_option("--store-dir", o.store_dir, "gloo FileStore directory (fresh per run)");
  app.add_option("--timeout-s", o.timeout_s)->check(dtrain::at_least(1));
  if (const auto code = dtrain::parse_args(app, argc, argv, "dtrain-bench-raw")) return *code;
  try {
    std::unique_ptr<Library> lib;
    if (o.library == "mpi") {
      lib = std::make_unique<MpiLibrary>();
    } else {
      lib = std::make_unique<GlooLibrary>(o.store_dir, std::chrono::seconds(o.timeout_s));
    }
    return run(*lib, o);
  } catch (const std::exception& e) {
    std::cerr << "dtrain-bench-raw: error: " << e.what() << "\n";
    return 2;
  }
}
