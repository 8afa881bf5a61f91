// Tracer: a Chrome trace (the JSON "traceEvents" format; Perfetto and
// chrome://tracing open it) of train.trace_steps ("A:B": steps A to B,
// 1-based as in metrics.jsonl; "A": one step), one file per rank,
// <out_dir>/trace_rank_<K>.json, written once after the last traced step.
//
// Events ("X" complete events; pid = rank; tid 0 the training thread, tid 1
// the comm thread): "step" (all of step(), args.step), "data wait",
// "forward"/"backward" per block and micro-batch (args.block, args.micro;
// the block's compute, without the engine's hooks), "grad sync" (waiting for
// the gradient collectives), "optimizer", "checkpoint", "eval", and every
// collective by kind with args.bytes (nccl-tests size) and args.seq, with the
// start and end the comm thread saw. Timestamps are microseconds of the
// system clock, so traces of several ranks line up (comm::Store-based
// merge: launcher/trace_merge.h).
//
// With a kernel profile (the scheduled profiler, worker/profiler.h) it also
// samples the CPU kernels' totals (nn/cpu/kernel_profile.h) at every span
// and block boundary and records, per kernel kind that ran in between, one
// event on tid 2 ("kernels") whose duration is that kind's summed time in the
// interval (args.calls, args.flops or args.bytes); the events of one interval
// are laid end to end from its start in the kinds' fixed order: the totals
// are exact, their placement within the interval is not.
//
// Memory: events go into an array allocated in the constructor; a full array
// drops further events (counted in the file's "dropped" field).
// Threading: the training thread calls everything but on_op(), which the
// comm thread calls; both may record at once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "comm/op_stats.h"
#include "nn/cpu/kernel_profile.h"
#include "nn/hooks.h"

namespace dtrain::worker {

struct TraceSteps {
  std::int64_t first = 0;
  std::int64_t last = 0;
};

// "A:B" or "A" -> steps; "" -> nullopt. Throws ConfigError naming
// train.trace_steps when malformed or not 1 <= A <= B.
std::optional<TraceSteps> parse_trace_steps(const std::string& text);

class Tracer : public nn::BlockHooks, public comm::OpObserver {
 public:
  using Clock = std::chrono::steady_clock;

  // Traces `steps` of a model with `blocks` blocks and `accum` micro-batches
  // per step, wrapping `inner` (the engine's hooks) while a step is traced.
  // An empty `file`: nothing is written (events_json() hands the events out).
  // `kernels`: the profile the device times its kernels into on this thread
  // (null: no kernel events); it must outlive the tracer.
  Tracer(int rank, TraceSteps steps, int blocks, int accum, std::filesystem::path file, nn::BlockHooks& inner,
         const nn::cpu::KernelProfile* kernels = nullptr);
  ~Tracer() override;

  // Step `step` (1-based) begins / its step() part ends / its iteration
  // (checkpoint, eval included) ends; the last traced one writes the file
  // and end_iteration returns true.
  void begin_step(std::int64_t step);
  void end_step();
  bool end_iteration();
  bool active() const { return active_.load(std::memory_order_relaxed); }
  void set_micro(int micro) { micro_ = micro; }
  // Records a span on the training thread (no-op while inactive). `name`
  // must be a string literal.
  void span(const char* name, Clock::time_point start, Clock::time_point end);
  // Writes the file now if a traced step began and it is not written yet;
  // returns whether it did (the same answer on every rank).
  bool finish();
  bool written() const { return written_; }
  // The trace-event objects recorded so far, metadata (process and thread
  // names) first, separated by ",\n", without the enclosing array: for
  // merging with other ranks'. Call when no step is traced.
  std::string events_json() const;
  std::size_t dropped() const { return dropped_.load(); }
  // Also tells `next` of every operation (traced or not): the communicator
  // has one observer, and two tracers may watch it.
  void set_next_observer(comm::OpObserver* next) { next_observer_ = next; }
  const std::filesystem::path& file() const { return file_; }

  void before_forward(int block) override;
  void after_forward(int block) override;
  void before_backward(int block) override;
  void after_backward(int block) override;
  void on_op(const comm::OpTiming& op) override;

 private:
  struct Event;
  void record(const char* name, int tid, Clock::time_point start, Clock::time_point end, std::int64_t a,
              std::int64_t b);
  void write();
  void sample_kernels();

  int rank_;
  TraceSteps steps_;
  std::filesystem::path file_;
  nn::BlockHooks& inner_;
  std::size_t capacity_;
  std::unique_ptr<Event[]> events_;
  std::atomic<std::size_t> next_{0};
  std::atomic<std::size_t> dropped_{0};
  std::atomic<bool> active_{false};
  std::atomic<std::int64_t> step_{0};  // read by the comm thread too
  int micro_ = 0;
  Clock::time_point step_start_;
  Clock::time_point block_start_;
  Clock::time_point origin_;                              // steady clock at construction
  std::chrono::system_clock::time_point origin_system_;   // system clock at construction
  bool written_ = false;
  bool began_ = false;  // a traced step began
  comm::OpObserver* next_observer_ = nullptr;
  const nn::cpu::KernelProfile* kernels_;
  std::array<nn::cpu::KernelTotals, nn::cpu::kKernelKinds> kernels_seen_{};  // at the last sample
  Clock::time_point kernels_seen_at_;
};

}  // namespace dtrain::worker
