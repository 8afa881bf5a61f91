#include "worker/trace.h"

#include <algorithm>
#include <charconv>
#include <fstream>

#include <fmt/format.h>

#include "comm/backend.h"
#include "core/error.h"

namespace dtrain::worker {
namespace {

bool parse_step(std::string_view text, std::int64_t& out) {
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

constexpr int kTrainTid = 0;
constexpr int kCommTid = 1;
constexpr int kKernelTid = 2;

}  // namespace

// One complete event; `ready` publishes it to the writer.
struct Tracer::Event {
  const char* name = "";
  int tid = 0;
  std::int64_t step = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t a = -1;  // block (forward/backward), bytes (collectives) or calls (kernels)
  std::int64_t b = -1;  // micro-batch (forward/backward), seq (collectives) or FLOPs/bytes (kernels)
  std::atomic<bool> ready{false};
};

std::optional<TraceSteps> parse_trace_steps(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const auto colon = text.find(':');
  TraceSteps s;
  const bool ok = colon == std::string::npos
                      ? parse_step(text, s.first) && parse_step(text, s.last)
                      : parse_step(std::string_view(text).substr(0, colon), s.first) &&
                            parse_step(std::string_view(text).substr(colon + 1), s.last);
  if (!ok || s.first < 1 || s.last < s.first) {
    throw ConfigError("train.trace_steps",
                      fmt::format("'{}' is not \"A:B\" (steps A to B, 1 <= A <= B) or \"A\"; e.g. \"10:15\"", text));
  }
  return s;
}

Tracer::Tracer(int rank, TraceSteps steps, int blocks, int accum, std::filesystem::path file, nn::BlockHooks& inner,
               const nn::cpu::KernelProfile* kernels)
    : rank_(rank), steps_(steps), file_(std::move(file)), inner_(inner), kernels_(kernels) {
  // Per micro-batch: forward and backward of every block, a data wait and up
  // to ~4 collectives per block (ZeRO-3); per step a handful more. Kernel
  // samples add a few kinds per interval (a block's forward: ~6).
  auto per_step = static_cast<std::size_t>(accum) * (6 * static_cast<std::size_t>(blocks) + 8) + 32;
  if (kernels_ != nullptr) per_step *= 8;
  capacity_ = static_cast<std::size_t>(steps.last - steps.first + 1) * per_step + 64;
  events_ = std::make_unique<Event[]>(capacity_);
  origin_ = Clock::now();
  origin_system_ = std::chrono::system_clock::now();
}

Tracer::~Tracer() = default;

void Tracer::record(const char* name, int tid, Clock::time_point start, Clock::time_point end, std::int64_t a,
                    std::int64_t b) {
  const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  if (i >= capacity_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Event& e = events_[i];
  e.name = name;
  e.tid = tid;
  e.step = step_.load(std::memory_order_relaxed);
  e.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(start - origin_).count();
  e.end_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(end - origin_).count();
  e.a = a;
  e.b = b;
  e.ready.store(true, std::memory_order_release);
}

void Tracer::begin_step(std::int64_t step) {
  step_ = step;
  micro_ = 0;
  step_start_ = Clock::now();
  const bool traced = !written_ && step >= steps_.first && step <= steps_.last;
  began_ = began_ || traced;
  if (traced && kernels_ != nullptr) {  // what ran before this step is not the step's
    for (int k = 0; k < nn::cpu::kKernelKinds; ++k) kernels_seen_[k] = (*kernels_)[static_cast<nn::cpu::KernelKind>(k)];
    kernels_seen_at_ = step_start_;
  }
  active_.store(traced, std::memory_order_relaxed);
}

void Tracer::end_step() {
  if (!active()) return;
  sample_kernels();
  record("step", kTrainTid, step_start_, Clock::now(), -1, -1);
}

bool Tracer::end_iteration() {
  const bool was_active = active();
  if (was_active) sample_kernels();  // the checkpoint's and eval's kernels
  active_.store(false, std::memory_order_relaxed);
  if (!was_active || step_.load() != steps_.last) return false;
  write();
  return true;
}

void Tracer::span(const char* name, Clock::time_point start, Clock::time_point end) {
  if (!active()) return;
  sample_kernels();
  record(name, kTrainTid, start, end, -1, -1);
}

bool Tracer::finish() {
  active_.store(false, std::memory_order_relaxed);
  if (written_ || !began_) return false;
  write();
  return true;
}

// One event per kernel kind that ran since the last sample, laid end to end
// from the last sample's time (see the header).
void Tracer::sample_kernels() {
  if (kernels_ == nullptr) return;
  const Clock::time_point now = Clock::now();
  Clock::time_point at = kernels_seen_at_;
  for (int k = 0; k < nn::cpu::kKernelKinds; ++k) {
    const auto kind = static_cast<nn::cpu::KernelKind>(k);
    const nn::cpu::KernelTotals& total = (*kernels_)[kind];
    nn::cpu::KernelTotals& seen = kernels_seen_[k];
    if (total.calls != seen.calls) {
      const auto took = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(std::max(0.0, total.seconds - seen.seconds)));
      record(nn::cpu::kernel_kind_name(kind).data(), kKernelTid, at, at + took, total.calls - seen.calls,
             static_cast<std::int64_t>(total.work - seen.work));
      at += took;
      seen = total;
    }
  }
  kernels_seen_at_ = now;
}

// The block's own compute: from after the engine's before_* hook (a ZeRO-3
// gather) to before its after_* hook (a DDP bucket's all-reduce launch).
void Tracer::before_forward(int block) {
  inner_.before_forward(block);
  if (active()) sample_kernels();
  block_start_ = Clock::now();
}

void Tracer::after_forward(int block) {
  if (active()) {
    sample_kernels();
    record("forward", kTrainTid, block_start_, Clock::now(), block, micro_);
  }
  inner_.after_forward(block);
}

void Tracer::before_backward(int block) {
  inner_.before_backward(block);
  if (active()) sample_kernels();
  block_start_ = Clock::now();
}

void Tracer::after_backward(int block) {
  if (active()) {
    sample_kernels();
    record("backward", kTrainTid, block_start_, Clock::now(), block, micro_);
  }
  inner_.after_backward(block);
}

void Tracer::on_op(const comm::OpTiming& op) {
  if (next_observer_ != nullptr) next_observer_->on_op(op);
  if (!active()) return;
  record(comm::op_kind_name(op.kind), kCommTid, op.start, op.end, static_cast<std::int64_t>(op.bytes),
         static_cast<std::int64_t>(op.seq));
}

std::string Tracer::events_json() const {
  const double origin_us =
      1e-3 * static_cast<double>(
                 std::chrono::duration_cast<std::chrono::nanoseconds>(origin_system_.time_since_epoch()).count());
  std::string out = fmt::format(
      "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"rank {0}\"}}}},\n"
      "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{0},\"tid\":0,\"args\":{{\"sort_index\":{0}}}}},\n"
      "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"training\"}}}},\n"
      "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{0},\"tid\":1,\"args\":{{\"name\":\"comm\"}}}}",
      rank_);
  if (kernels_ != nullptr) {
    out += fmt::format(
        ",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"kernels\"}}}}",
        rank_, kKernelTid);
  }
  const std::size_t n = std::min(next_.load(), capacity_);
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = events_[i];
    if (!e.ready.load(std::memory_order_acquire)) continue;  // still being recorded: leave it out
    std::string args;
    const char* cat = "train";
    if (e.tid == kCommTid) {
      cat = "comm";
      args = fmt::format("\"step\":{},\"bytes\":{},\"seq\":{}", e.step, e.a, e.b);
    } else if (e.tid == kKernelTid) {
      cat = "kernel";
      args = fmt::format("\"step\":{},\"calls\":{},\"{}\":{}", e.step, e.a,
                         std::string_view(e.name) == "gemm" ? "flops" : "bytes", e.b);
    } else if (e.a >= 0) {
      args = fmt::format("\"step\":{},\"block\":{},\"micro\":{}", e.step, e.a, e.b);
    } else {
      args = fmt::format("\"step\":{}", e.step);
    }
    out += fmt::format(",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},"
                       "\"dur\":{:.3f},\"args\":{{{}}}}}",
                       e.name, cat, rank_, e.tid, origin_us + 1e-3 * static_cast<double>(e.start_ns),
                       1e-3 * static_cast<double>(e.end_ns - e.start_ns), args);
  }
  return out;
}

void Tracer::write() {
  written_ = true;
  if (file_.empty()) return;  // the owner collects events_json()
  std::ofstream out(file_);
  out << fmt::format("{{\"displayTimeUnit\":\"ms\",\"dropped\":{},\"traceEvents\":[\n", dropped_.load());
  out << events_json();
  out << "\n]}\n";
  if (!out.flush()) throw IoError(fmt::format("cannot write the trace '{}'", file_.string()));
}

}  // namespace dtrain::worker
