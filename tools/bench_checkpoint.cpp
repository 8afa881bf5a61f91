#include "tools/bench_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/syscall.h"
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

// A file descriptor that closes itself (unchecked: see core/syscall.h; the
// files written here are fsynced first).
struct Fd {
  int fd;
  Fd(const fs::path& path, int flags) : fd(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {
    if (fd < 0) throw_errno("cannot open", path.string());
  }
  ~Fd() { ::close(fd); }
};

// Drops the file's pages from the page cache (they are clean after fsync),
// so the next read comes from the device. A failure throws: the "cold" read
// would silently be measured warm.
void drop_cache(const fs::path& path) {
  Fd f(path, O_RDONLY);
  DTRAIN_SYSCALL_ERRNUM(::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED),
                        fmt::format("cannot drop '{}' from the page cache for a cold read", path.string()));
}

void drop_cache_of_dir(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) drop_cache(e.path());
  }
}

// Waits until the storage is quiet: on virtual disks an fsync can return
// while the host still writes the data back, and a read measured then pays
// for that writeback. Every timed operation starts after this, so the
// baseline and dtrain's save and load meet the same conditions.
void settle(double seconds) {
  ::sync();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// The write baseline: the same slices written back to back to one new
// file, fsync'd with its directory (what any save must at least do).
double plain_write(const std::vector<sharding::StateSlice>& slices, const fs::path& dir, double settle_s) {
  const fs::path path = dir / "plain.bin";
  settle(settle_s);
  const auto t0 = Clock::now();
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
  const double seconds = seconds_since(t0);
  fs::remove(path);
  return seconds;
}

// The read baseline: every file of the saved step read front to back with
// plain 8 MiB preads into one buffer, cold. Reading the step's own files (not a
// copy written at another time) matters here: on a virtual disk the read
// speed of a file depends on when and how it was written, which would be
// measured instead of the load's own cost.
constexpr std::size_t kPlainReadChunk = std::size_t{8} << 20;  // what `dd bs=8M` would ask for

double plain_read(const fs::path& step_dir, std::vector<char>& buffer, double settle_s) {
  drop_cache_of_dir(step_dir);
  settle(settle_s);
  const auto t0 = Clock::now();
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (!e.is_regular_file()) continue;
    const std::size_t total = static_cast<std::size_t>(e.file_size());
    if (buffer.size() < total) throw Error(fmt::format("read buffer smaller than {}", e.path().string()));
    Fd f(e.path(), O_RDONLY);
    for (std::size_t done = 0; done < total;) {
      const std::size_t want = std::min(total - done, kPlainReadChunk);
      const ssize_t n = ::pread(f.fd, buffer.data() + done, want, static_cast<off_t>(done));
      if (n <= 0) throw_errno("cannot read", e.path().string());
      done += static_cast<std::size_t>(n);
    }
  }
  return seconds_since(t0);
}

// A cold resume from step_dir into the trainer's engine.
double load(worker::Trainer& trainer, const config::Config& config, const fs::path& step_dir, double settle_s) {
  config::Config load_config = config;
  load_config.mutable_checkpoint()->set_resume(step_dir.string());
  worker::Checkpointer loader(load_config, trainer.engine(), trainer.communicator());
  drop_cache_of_dir(step_dir);
  settle(settle_s);
  const auto t0 = Clock::now();
  loader.resume(nullptr);
  return seconds_since(t0);
}

struct Figures {
  std::vector<double> plain_write, plain_read, save, load, async_blocked, async_write;
};

// One round: the write baseline, a synchronous save, its load and the read
// baseline over the same files (in alternating order, so neither always
// comes first after the save), an asynchronous save while training goes on.
// The saves are the trainer's own, as in a run: its steps wait for an async
// save's copy before they update the state (Checkpointer::before_update).
void measure_round(worker::Trainer& trainer, const config::Config& config, const fs::path& dir, int round,
                   std::vector<char>& read_buffer, double settle_s, Figures& f) {
  f.plain_write.push_back(plain_write(trainer.engine().owned_state(), dir, settle_s));

  settle(settle_s);
  trainer.save_checkpoint();
  const worker::Checkpointer& saver = trainer.checkpointer();
  f.save.push_back(saver.last_save().blocked_s);

  const fs::path step_dir = checkpoint::step_dir(saver.root(), trainer.steps_done());
  if (round % 2 == 0) {
    f.plain_read.push_back(plain_read(step_dir, read_buffer, settle_s));
    f.load.push_back(load(trainer, config, step_dir, settle_s));
  } else {
    f.load.push_back(load(trainer, config, step_dir, settle_s));
    f.plain_read.push_back(plain_read(step_dir, read_buffer, settle_s));
  }

  trainer.step();  // the async save gets a step of its own
  settle(settle_s);
  trainer.start_checkpoint();
  while (saver.in_flight()) trainer.step();  // steps commit the save once every rank wrote its part
  f.async_blocked.push_back(saver.last_save().blocked_s);
  f.async_write.push_back(saver.last_save().write_s);
  trainer.step();  // the next round's sync save gets a step of its own
}

std::string reproduce_command(const CheckpointBenchOptions& o) {
  std::string cmd = fmt::format("dtrain-bench checkpoint --config {} --dir {} --repeats {} --settle {}",
                                o.config_path, o.dir, o.repeats, o.settle_s);
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
  std::cout << fmt::format("{:>24} {:>10.1f} {:>10.3f} {:>8}\n", "plain read of its files", 1e3 * pr, gb / pr, "1.00");
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
    worker::TrainerOptions trainer_options;
    trainer_options.write_outputs = false;
    worker::Trainer trainer(config, trainer_options);
    trainer.step();
    std::int64_t floats = 0;
    for (const auto& s : trainer.engine().owned_state()) floats += s.range.size;
    gb = static_cast<double>(floats) * sizeof(float) / 1e9;
    // The rank file holds the state plus its header and alignment padding.
    std::vector<char> read_buffer(static_cast<std::size_t>(floats) * sizeof(float) + (std::size_t{1} << 20), 0);
    for (int round = 0; round < options.repeats; ++round) {
      measure_round(trainer, config, dir, round, read_buffer, options.settle_s, f);
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
