#include "worker/trace.h"

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

}  // namespace

// One complete event; `ready` publishes it to the writer.
struct Tracer::Event {
  const char* name = "";
  int tid = 0;
  std::int64_t step = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t a = -1;  // block (forward/backward) or bytes (collectives)
  std::int64_t b = -1;  // micro-batch (forward/backward) or seq (collectives)
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

Tracer::Tracer(int rank, TraceSteps steps, int blocks, int accum, std::filesystem::path file, nn::BlockHooks& inner)
    : rank_(rank), steps_(steps), file_(std::move(file)), inner_(inner) {
  // Per micro-batch: forward and backward of every block, a data wait and up
  // to ~4 collectives per block (ZeRO-3); per step a handful more.
  const auto per_step = static_cast<std::size_t>(accum) * (6 * static_cast<std::size_t>(blocks) + 8) + 32;
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
  active_.store(!written_ && step >= steps_.first && step <= steps_.last, std::memory_order_relaxed);
}

void Tracer::end_step() {
  if (active()) record("step", kTrainTid, step_start_, Clock::now(), -1, -1);
}

void Tracer::end_iteration() {
  const bool was_active = active();
  active_.store(false, std::memory_order_relaxed);
  if (was_active && step_.load() == steps_.last) write();
}

void Tracer::span(const char* name, Clock::time_point start, Clock::time_point end) {
  if (active()) record(name, kTrainTid, start, end, -1, -1);
}

void Tracer::finish() {
  active_.store(false, std::memory_order_relaxed);
  if (!written_ && next_.load() > 0) write();
}

// The block's own compute: from after the engine's before_* hook (a ZeRO-3
// gather) to before its after_* hook (a DDP bucket's all-reduce launch).
void Tracer::before_forward(int block) {
  inner_.before_forward(block);
  block_start_ = Clock::now();
}

void Tracer::after_forward(int block) {
  if (active()) record("forward", kTrainTid, block_start_, Clock::now(), block, micro_);
  inner_.after_forward(block);
}

void Tracer::before_backward(int block) {
  inner_.before_backward(block);
  block_start_ = Clock::now();
}

void Tracer::after_backward(int block) {
  if (active()) record("backward", kTrainTid, block_start_, Clock::now(), block, micro_);
  inner_.after_backward(block);
}

void Tracer::on_op(const comm::OpTiming& op) {
  if (!active()) return;
  record(comm::op_kind_name(op.kind), kCommTid, op.start, op.end, static_cast<std::int64_t>(op.bytes),
         static_cast<std::int64_t>(op.seq));
}

void Tracer::write() {
  written_ = true;
  const double origin_us =
      1e-3 * static_cast<double>(
                 std::chrono::duration_cast<std::chrono::nanoseconds>(origin_system_.time_since_epoch()).count());
  std::ofstream out(file_);
  out << fmt::format("{{\"displayTimeUnit\":\"ms\",\"dropped\":{},\"traceEvents\":[\n", dropped_.load());
  out << fmt::format("{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"rank {0}\"}}}},\n"
                     "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{0},\"tid\":0,\"args\":{{\"sort_index\":{0}}}}},\n"
                     "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"training\"}}}},\n"
                     "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{0},\"tid\":1,\"args\":{{\"name\":\"comm\"}}}}",
                     rank_);
  const std::size_t n = std::min(next_.load(), capacity_);
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = events_[i];
    if (!e.ready.load(std::memory_order_acquire)) continue;  // still being recorded: leave it out
    std::string args;
    if (e.tid == kCommTid) {
      args = fmt::format("\"bytes\":{},\"seq\":{}", e.a, e.b);
    } else if (e.a >= 0) {
      args = fmt::format("\"step\":{},\"block\":{},\"micro\":{}", e.step, e.a, e.b);
    } else {
      args = fmt::format("\"step\":{}", e.step);
    }
    out << fmt::format(",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},"
                       "\"dur\":{:.3f},\"args\":{{{}}}}}",
                       e.name, e.tid == kCommTid ? "comm" : "train", rank_, e.tid,
                       origin_us + 1e-3 * static_cast<double>(e.start_ns),
                       1e-3 * static_cast<double>(e.end_ns - e.start_ns), args);
  }
  out << "\n]}\n";
  if (!out.flush()) throw IoError(fmt::format("cannot write the trace '{}'", file_.string()));
}

}  // namespace dtrain::worker
