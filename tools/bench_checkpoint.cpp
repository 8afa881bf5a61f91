#include "tools/bench_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "worker/checkpointing.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A file descriptor that closes itself.
struct Fd {
  int fd;
  Fd(const fs::path& path, int flags) : fd(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {
    if (fd < 0) throw_errno("cannot open", path.string());
  }
  ~Fd() { ::close(fd); }
};

// Drops the file's pages from the page cache (they are clean after fsync),
// so the next read comes from the device.
void drop_cache(const fs::path& path) {
  Fd f(path, O_RDONLY);
  ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
}

void drop_cache_of_dir(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) drop_cache(e.path());
  }
}

// The baseline: the same slices written back to back to one file, fsync'd
// with its directory, then read back into one buffer.
struct Plain {
  double write_s = 0.0, read_s = 0.0;
};

Plain plain_write_read(const std::vector<sharding::StateSlice>& slices, const fs::path& dir,
                       std::vector<float>& read_buffer) {
  const fs::path path = dir / "plain.bin";
  Plain p;
  auto t0 = Clock::now();
  {
    Fd f(path, O_WRONLY | O_CREAT | O_EXCL);
    for (const auto& s : slices) {
      const char* data = reinterpret_cast<const char*>(s.data);
      std::size_t left = static_cast<std::size_t>(s.range.size) * sizeof(float);
      while (left > 0) {
        const ssize_t n = ::write(f.fd, data, left);
        if (n < 0) throw_errno("cannot write", path.string());
        data += n;
        left -= static_cast<std::size_t>(n);
      }
    }
    if (::fsync(f.fd) != 0) throw_errno("cannot fsync", path.string());
    Fd d(dir, O_RDONLY | O_DIRECTORY);
    if (::fsync(d.fd) != 0) throw_errno("cannot fsync", dir.string());
  }
  p.write_s = seconds_since(t0);
  drop_cache(path);
  t0 = Clock::now();
  {
    Fd f(path, O_RDONLY);
    char* out = reinterpret_cast<char*>(read_buffer.data());
    const std::size_t total = read_buffer.size() * sizeof(float);
    for (std::size_t done = 0; done < total;) {
      const ssize_t n = ::pread(f.fd, out + done, total - done, static_cast<off_t>(done));
      if (n <= 0) throw_errno("cannot read", path.string());
      done += static_cast<std::size_t>(n);
    }
  }
  p.read_s = seconds_since(t0);
  fs::remove(path);
  return p;
}

struct Figures {
  std::vector<double> plain_write, plain_read, save, load, async_blocked, async_write;
};

// One round: baseline, a synchronous save and its load, an asynchronous save.
void measure_round(worker::Trainer& trainer, worker::Checkpointer& saver, const config::Config& config,
                   const fs::path& dir, int round, std::vector<float>& read_buffer, Figures& f) {
  const std::vector<sharding::StateSlice> slices = trainer.engine().owned_state();
  const Plain p = plain_write_read(slices, dir, read_buffer);
  f.plain_write.push_back(p.write_s);
  f.plain_read.push_back(p.read_s);

  const std::int64_t step = 1000 + 2 * round;
  saver.save(step, 0, step);
  f.save.push_back(saver.last_save().blocked_s);

  const fs::path step_dir = checkpoint::step_dir(saver.root(), step);
  drop_cache_of_dir(step_dir);
  config::Config load_config = config;
  load_config.mutable_checkpoint()->set_resume(step_dir.string());
  worker::Checkpointer loader(load_config, trainer.engine(), trainer.communicator());
  const auto t0 = Clock::now();
  loader.resume(nullptr);
  f.load.push_back(seconds_since(t0));

  saver.start_save(step + 1, 0, step + 1);
  while (saver.in_flight()) {
    trainer.step();  // training goes on while the file is written
    if (saver.ready()) saver.advance();
  }
  f.async_blocked.push_back(saver.last_save().blocked_s);
  f.async_write.push_back(saver.last_save().write_s);
}

std::string reproduce_command(const CheckpointBenchOptions& o) {
  std::string cmd = fmt::format("dtrain-bench checkpoint --config {} --dir {} --repeats {}", o.config_path, o.dir,
                                o.repeats);
  for (const std::string& s : o.overrides) cmd += " --set " + s;
  return cmd;
}

void print(const CheckpointBenchOptions& o, double gb, const Figures& f) {
  const double pw = median(f.plain_write), pr = median(f.plain_read), save = median(f.save),
               load = median(f.load), blocked = median(f.async_blocked);
  std::cout << fmt::format("dtrain-bench checkpoint: {} ({:.3f} GB of state per save, one rank, median of {})\n",
                           o.config_path, gb, o.repeats);
  std::cout << fmt::format("{:>24} {:>10} {:>10} {:>8}\n", "", "ms", "GB/s", "ratio");
  std::cout << fmt::format("{:>24} {:>10.1f} {:>10.3f} {:>8}\n", "plain write+fsync", 1e3 * pw, gb / pw, "1.00");
  std::cout << fmt::format("{:>24} {:>10.1f} {:>10.3f} {:>8.2f}\n", "checkpoint save", 1e3 * save, gb / save,
                           pw / save);
  std::cout << fmt::format("{:>24} {:>10.1f} {:>10.3f} {:>8}\n", "plain read (cold)", 1e3 * pr, gb / pr, "1.00");
  std::cout << fmt::format("{:>24} {:>10.1f} {:>10.3f} {:>8.2f}\n", "checkpoint load (cold)", 1e3 * load,
                           gb / load, pr / load);
  std::cout << fmt::format("{:>24} {:>10.1f} {:>10} {:>8.3f}\n", "async save: blocked", 1e3 * blocked, "",
                           blocked / save);
  std::cout << fmt::format("state_gb: {:.4f}\n", gb);
  std::cout << fmt::format("plain_write_gbps: {:.3f}\nsave_gbps: {:.3f}\nsave_ratio: {:.3f}\n", gb / pw, gb / save,
                           pw / save);
  std::cout << fmt::format("plain_read_gbps: {:.3f}\nload_gbps: {:.3f}\nload_ratio: {:.3f}\n", gb / pr, gb / load,
                           pr / load);
  std::cout << fmt::format("sync_save_ms: {:.2f}\nasync_blocked_ms: {:.2f}\nasync_write_ms: {:.2f}\n", 1e3 * save,
                           1e3 * blocked, 1e3 * median(f.async_write));
  std::cout << fmt::format("async_blocked_fraction: {:.4f}\n", blocked / save);
  std::cout << "command: " << reproduce_command(o) << "\n" << std::flush;
}

}  // namespace

int run_checkpoint_bench(const CheckpointBenchOptions& options) {
  config::Config config = worker::load_config(options.config_path, options.overrides);
  const fs::path parent = options.dir.empty() ? fs::temp_directory_path() : fs::path(options.dir);
  std::string pattern = (parent / "dtrain-bench-ckpt-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw_errno("cannot create a directory under", parent.string());
  const fs::path dir = pattern;
  config.mutable_checkpoint()->set_dir((dir / "checkpoints").string());
  // Every step is kept until the end: deleting the previous round's files
  // (and the discards and journal commits that follow) would overlap the
  // next measurement. The directory is removed when the benchmark ends.
  config.mutable_checkpoint()->set_keep_last(1000);
  config.mutable_checkpoint()->set_resume("none");
  config.mutable_checkpoint()->set_async(true);
  config.mutable_train()->set_steps(1000000);
  Figures f;
  double gb = 0.0;
  try {
    worker::Trainer trainer(config, {.write_outputs = false, .console = nullptr, .comm = nullptr});
    trainer.step();
    std::int64_t floats = 0;
    for (const auto& s : trainer.engine().owned_state()) floats += s.range.size;
    gb = static_cast<double>(floats) * sizeof(float) / 1e9;
    std::vector<float> read_buffer(static_cast<std::size_t>(floats), 0.0f);
    // One saver for every round, as in training: its snapshot buffer is reused.
    worker::Checkpointer saver(config, trainer.engine(), trainer.communicator());
    for (int round = 0; round < options.repeats; ++round) {
      measure_round(trainer, saver, config, dir, round, read_buffer, f);
    }
  } catch (...) {
    fs::remove_all(dir);
    throw;
  }
  fs::remove_all(dir);
  print(options, gb, f);
  return 0;
}

}  // namespace dtrain::tools
