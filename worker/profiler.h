// Profiler: train.profile_steps (dtrain-worker --profile-steps), a schedule
// as torch.profiler.schedule(wait, warmup, active): of the steps this
// invocation runs, the first `wait` are left alone, the next `warmup` run
// with the kernel timers on and keep nothing, and the next `active` are
// recorded on every rank: the CPU kernels' times per interval
// (nn/cpu/kernel_profile.h: GEMMs, copies, conversions, ...; plain CPU
// device only), the blocks' forward and backward, the data waits, the
// gradient sync, the optimizer, checkpoint and eval, and every collective
// with its bytes (worker/trace.h records them all).
//
// After the last active step (or at the end of a run stopped before it) the
// ranks hand their events to rank 0 through the communicator (an allgather
// of their lengths, then of the texts), and rank 0 writes one Chrome trace
// (trace-event JSON, gzip) for all ranks, a process per rank and a thread per
// stream, where TensorBoard's profile plugin looks:
// <train.tensorboard_dir>/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.trace.json.gz,
// and beside it the same events as <host>.xplane.pb, the XSpace the
// plugin's trace viewer reads since its 2.19 (xprof): rank K is its process
// "/device:CUSTOM:K".
// Observability never stops a run: a file that cannot be written costs one
// warning.
//
// Threading: the training thread calls everything; the tracer's on_op runs
// on the comm thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/cpu/kernel_profile.h"
#include "nn/device.h"
#include "worker/trace.h"

namespace dtrain::worker {

struct ProfileSchedule {
  int wait = 0;
  int warmup = 0;
  int active = 0;
};

// "wait=W,warmup=U,active=A" (any order; wait and warmup default 0, active
// at least 1) -> the schedule; "" -> nullopt. Throws ConfigError naming
// train.profile_steps when malformed.
std::optional<ProfileSchedule> parse_profile_steps(const std::string& text);

// The same events as an XSpace (proto/xplane.proto), serialized: the
// <host>.xplane.pb that TensorBoard's profile plugin (xprof) builds its trace
// viewer from. `rank_events` are the ranks' Tracer::events_json(), in rank
// order.
std::string profile_xspace(const std::vector<std::string>& rank_events, const std::string& host);

// The run folder's name for a profile written at `t`: YYYY_MM_DD_HH_MM_SS
// (UTC), as TensorFlow's profiler names them.
std::string profile_run_name(std::chrono::system_clock::time_point t);

class Profiler {
 public:
  // Profiles the steps after `first_step` (the last step done before this
  // invocation) by `schedule`, of a model with `blocks` blocks and `accum`
  // micro-batches per step on `device`, wrapping `inner` hooks. Rank 0
  // writes under `tensorboard_dir` (empty: nowhere) and prints where to
  // `console` (may be null), warnings to `warnings`.
  Profiler(ProfileSchedule schedule, std::int64_t first_step, comm::Communicator& comm, nn::Device& device,
           int blocks, int accum, nn::BlockHooks& inner, std::filesystem::path tensorboard_dir,
           std::ostream* console, std::ostream& warnings);
  ~Profiler();

  Tracer& tracer() { return *tracer_; }
  bool active() const { return tracer_->active(); }
  // Around each step, as Tracer's; end_iteration() and finish() collect and
  // write the trace when the active steps are over (every rank calls them:
  // they run collectives).
  void begin_step(std::int64_t step);
  void end_step() { tracer_->end_step(); }
  void end_iteration();
  void finish();
  // The trace rank 0 wrote, once written.
  const std::optional<std::filesystem::path>& written() const { return written_; }

 private:
  void set_kernel_timing(bool on);
  void collect();

  comm::Communicator& comm_;
  nn::Device& device_;
  TraceSteps active_steps_;
  std::int64_t last_recorded_ = 0;  // the last active step begun
  std::int64_t warmup_first_;
  std::filesystem::path tensorboard_dir_;
  std::ostream* console_;
  std::ostream& warnings_;
  nn::cpu::KernelProfile kernels_;
  bool timing_ = false;  // the device times its kernels into kernels_
  std::unique_ptr<Tracer> tracer_;
  std::optional<std::filesystem::path> written_;
};

}  // namespace dtrain::worker
