// Trainer's step loop, evaluation, checkpoints and progress lines (set-up:
// trainer_setup.cpp).
#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <ostream>
#include <thread>

#include "core/error.h"
#include "core/process.h"
#include "nn/adamw.h"
#include "nn/cpu/matmul.h"
#include "worker/heartbeat.h"
#include "worker/metrics_publisher.h"
#include "worker/precision.h"
#include "worker/profiler.h"
#include "worker/signals.h"
#include "worker/tensorboard.h"
#include "worker/trace.h"

namespace dtrain::worker {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

std::int64_t Trainer::device_bytes() const {
  if (device_->host_memory()) return 0;
  return model_->activation_bytes() + engine_->memory().model_state_bytes() + engine_->memory().working_bytes;
}

Trainer::~Trainer() {
  if (tracer_ || profiler_) comm_->set_op_observer(nullptr);  // the communicator may outlive the tracers
}

nn::BlockHooks& Trainer::hooks() {
  if (profiler_ && profiler_->active()) return profiler_->tracer();  // wraps tracer_ when there is one
  if (tracer_ && tracer_->active()) return *tracer_;
  return *engine_;
}

void Trainer::trace_span(const char* name, Clock::time_point start, Clock::time_point end) {
  if (tracer_) tracer_->span(name, start, end);
  if (profiler_) profiler_->tracer().span(name, start, end);
}

void Trainer::record_live(const StepResult& r, double compute_s, double data_wait_s) {
  if (options_.live_metrics == nullptr) return;
  const double tokens_per_s = r.seconds > 0.0 ? static_cast<double>(tokens_per_step()) / r.seconds : 0.0;
  options_.live_metrics->record_step({r.step, r.loss, r.lr, r.seconds, compute_s, data_wait_s, tokens_per_s,
                                      model_config_.flops_per_token(seq_) * tokens_per_s, r.grad_norm,
                                      tokens_per_step()});
}

std::int64_t Trainer::tokens_per_step() const {
  return static_cast<std::int64_t>(config_.train().grad_accum_steps()) * batch_ * seq_ *
         comm_->world_size();
}

StepResult Trainer::step() {
  const auto t0 = Clock::now();
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::forward, step_);
  if (tracer_) tracer_->begin_step(step_ + 1);
  if (profiler_) profiler_->begin_step(step_ + 1);
  const LocalStep local = compute_step(t0);
  // The loss of the whole global batch (the mean over ranks), and whether any
  // rank was asked to stop: every rank sees the same answer at this boundary.
  // The same all-reduce tells whether every rank's part of a background
  // checkpoint is done (the mean of 0/1 flags is 1 exactly when all are 1).
  const int signal = stop_signal();
  float shared[4] = {local.loss, signal != 0 ? 1.0f : 0.0f,
                     static_cast<float>(signal), checkpointer_->ready() ? 1.0f : 0.0f};
  if (comm_->world_size() > 1) comm_->allreduce(shared, 4, DType::f32, comm::ReduceOp::avg).wait();
  ++step_;
  if (checkpointer_->in_flight() && shared[3] == 1.0f) checkpointer_->advance();
  StepResult result{step_, shared[0], local.lr, static_cast<float>(local.norm), seconds_since(t0)};
  if (shared[1] > 0.0f) result.stop_signal = signal != 0 ? signal : static_cast<int>(shared[2] / shared[1] + 0.5f);
  if (tracer_) tracer_->end_step();
  if (profiler_) profiler_->end_step();
  record_live(result, local.compute_s, local.data_wait_s);
  return result;
}

// The next training micro-batch; adds the time spent waiting for it to
// data_wait. Shared by the CPU and GPU steps. The batch stays valid until
// the next call.
nn::ModelInputs Trainer::next_micro_batch(int micro, double& data_wait) {
  const auto wait_start = Clock::now();
  const data::Batch& batch = train_loader_->next(std::chrono::seconds(config_.parallel().timeout_s()));
  const auto wait_end = Clock::now();
  data_wait += std::chrono::duration<double>(wait_end - wait_start).count();
  trace_span("data wait", wait_start, wait_end);
  if (tracer_) tracer_->set_micro(micro);
  if (profiler_) profiler_->tracer().set_micro(micro);
  if (options_.testonly_slow_ms > 0 && micro == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.testonly_slow_ms));
  }
  return nn::ModelInputs{batch.tokens.data(), batch.patches.data(), batch.targets.data()};
}

// The micro-batches queue their work on the device; the host waits once, for
// the gradient norm (the loss is ready by then). On an asynchronous device
// the host runs ahead until then, so compute_s is the whole step less the
// data waits; on the plain host device it ends where communication begins.
Trainer::LocalStep Trainer::compute_step(Clock::time_point t0) {
  const config::Train& t = config_.train();
  const int accum = t.grad_accum_steps();
  engine_->begin_step();
  model_->reset_result();
  double data_wait = 0.0;
  for (int micro = 0; micro < accum; ++micro) {
    const nn::ModelInputs inputs = next_micro_batch(micro, data_wait);
    engine_->set_sync(micro == accum - 1);  // accumulate locally, communicate once
    model_->forward(inputs, hooks(), true, nn::StepKey{t.seed(), step_, micro, comm_->rank() * t.micro_batch_size()});
    if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::backward, step_);
    model_->backward(hooks(), engine_->loss_scale() / static_cast<float>(accum));
  }
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::optimizer, step_);
  const auto sync_start = Clock::now();
  engine_->finish_backward();
  const auto optimizer_start = Clock::now();
  trace_span("grad sync", sync_start, optimizer_start);
  const double norm = engine_->grad_norm();  // the host's one wait for the device
  const float loss = model_->collect().loss;
  const double compute_s =
      std::chrono::duration<double>((device_->asynchronous() ? Clock::now() : sync_start) - t0).count() - data_wait;
  const config::Optimizer& o = config_.optimizer();
  const float clip = nn::clip_factor(norm, o.grad_clip());
  const float lr = schedule_.at(step_);
  const nn::AdamWHyper hyper{lr, o.beta1(), o.beta2(), o.eps(), o.weight_decay()};
  checkpointer_->before_update();  // an async save may still be copying the state
  if (engine_->step(hyper, optimizer_steps_ + 1, clip)) ++optimizer_steps_;  // a skipped fp16 step does not count
  trace_span("optimizer", optimizer_start, Clock::now());
  return LocalStep{loss, lr, norm, compute_s, data_wait};
}

void Trainer::save_checkpoint() {
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::checkpoint, step_);
  checkpointer_->save(step_, train_loader_->position(), optimizer_steps_);
}

void Trainer::start_checkpoint() { checkpointer_->start_save(step_, train_loader_->position(), optimizer_steps_); }

void Trainer::finish_checkpoint() { checkpointer_->finish_save(); }

EvalResult Trainer::evaluate() {
  const auto timeout = std::chrono::seconds(config_.parallel().timeout_s());
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::eval, step_);
  val_loader_->reset(0);
  const int batches = config_.train().eval_batches();
  model_->reset_result();
  for (int i = 0; i < batches; ++i) {
    const data::Batch& batch = val_loader_->next(timeout);
    model_->forward(nn::ModelInputs{batch.tokens.data(), batch.patches.data(), batch.targets.data()}, *engine_,
                    false, nn::StepKey{});
  }
  // The mean over every scored row; the batches are of equal size.
  const nn::ForwardResult r = model_->collect();
  double loss_sum = static_cast<double>(r.loss) * batches;
  std::int64_t correct = r.correct, count = r.count;
  if (comm_->world_size() > 1) {  // every rank evaluated its slice of each batch
    float totals[3] = {static_cast<float>(loss_sum), static_cast<float>(correct), static_cast<float>(count)};
    comm_->allreduce(totals, 3, DType::f32, comm::ReduceOp::sum).wait();
    loss_sum = totals[0] / static_cast<float>(comm_->world_size());
    correct = static_cast<std::int64_t>(totals[1]);
    count = static_cast<std::int64_t>(totals[2]);
  }
  EvalResult e;
  e.loss = loss_sum / batches;
  if (model_config_.kind == nn::ModelConfig::Kind::classifier) {
    e.accuracy = static_cast<double>(correct) / static_cast<double>(count);
  } else {
    e.perplexity = std::exp(e.loss);
  }
  return e;
}

// A stop signal (preemption) saves at once, before the evaluation that may
// follow, so the checkpoint exists even if the grace period ends during it.
bool Trainer::checkpoint_after(const StepResult& r) {
  const bool last = r.step == config_.train().steps() && config_.checkpoint().every_steps() > 0;
  if (r.stop_signal != 0 || last) {
    save_checkpoint();  // nothing left to overlap it with
    return true;
  }
  if (!checkpointer_->due(r.step)) return false;
  config_.checkpoint().async() ? start_checkpoint() : save_checkpoint();
  return true;
}

std::optional<std::filesystem::path> Trainer::trace_file() const {
  if (!tracer_ || !tracer_->written()) return std::nullopt;
  return tracer_->file();
}

TrainSummary Trainer::run() {
  const config::Train& t = config_.train();
  TrainSummary summary;
  if (step_ >= t.steps()) {  // a finished run started again: nothing to do, nothing written
    if (options_.console != nullptr) {
      *options_.console << fmt::format("already finished at step {} (train.steps = {}); raise train.steps to train "
                                       "on, or choose a new train.out_dir\n",
                                       step_, t.steps());
    }
    summary.steps = step_;
    summary.already_finished = true;
    return summary;
  }
  log_run_facts();
  const auto start = Clock::now();
  const std::int64_t first_step = step_;  // a resumed run counts only the steps it runs
  double window_seconds = 0.0, window_exposed = 0.0;
  std::int64_t window_steps = 0;
  double timed_seconds = 0.0;  // all steps but the first, which pays one-time set-up
  StepResult r;
  while (step_ < t.steps()) {
    r = step();
    window_seconds += r.seconds;
    window_exposed += engine_->comm_stats().exposed_seconds;
    ++window_steps;
    if (r.step > first_step + 1) timed_seconds += r.seconds;
    if (r.step % t.log_every() == 0 || r.step == t.steps()) {
      const double step_ms = 1e3 * window_seconds / static_cast<double>(window_steps);
      const double tps = static_cast<double>(tokens_per_step()) * 1e3 / step_ms;
      if (metrics_) metrics_->log_step(r.step, r.loss, r.lr, r.grad_norm, tps, step_ms);
      log_progress(r, tps, step_ms, seconds_since(start), r.step - first_step);
      log_tensorboard(r, tps, step_ms, window_exposed / static_cast<double>(window_steps));
      window_seconds = window_exposed = 0.0;
      window_steps = 0;
    } else if (r.step == first_step + 1 && r.seconds > 0.0) {  // a first sign of life, on the console only
      log_progress(r, static_cast<double>(tokens_per_step()) / r.seconds, 1e3 * r.seconds, seconds_since(start), 1);
    }
    if (histograms_due(r.step)) TensorBoardLog::log_histograms(*engine_, r.step, tensorboard_.get());
    if (options_.after_step && r.stop_signal == 0) options_.after_step(r);
    const auto checkpoint_start = Clock::now();
    if (checkpoint_after(r)) trace_span("checkpoint", checkpoint_start, Clock::now());
    note_saves();
    if ((t.eval_every() > 0 && r.step % t.eval_every() == 0) || r.step == t.steps()) {
      const auto eval_start = Clock::now();
      const EvalResult e = evaluate();
      trace_span("eval", eval_start, Clock::now());
      if (metrics_) metrics_->log_eval(r.step, e.loss, e.accuracy, e.perplexity);
      if (tensorboard_) tensorboard_->log_eval(r.step, e.loss, e.accuracy, e.perplexity);
      log_eval(e);
      if (options_.live_metrics != nullptr) options_.live_metrics->record_eval(e.loss, e.accuracy);
      if (r.step == t.steps()) summary.final_eval = e;
    }
    if (r.stop_signal != 0) {
      if (options_.console != nullptr) {
        *options_.console << fmt::format("stopping after step {} on signal {}: checkpoint saved in {}\n", r.step,
                                         r.stop_signal, checkpointer_->root().string());
      }
      summary.stopped_by_signal = r.stop_signal;
      break;
    }
    if (tracer_) tracer_->end_iteration();      // writes the trace after its last step
    if (profiler_) profiler_->end_iteration();  // rank 0 writes the profile after its last step
  }
  finish_checkpoint();  // a save still in flight commits before the run ends
  note_saves();
  if (tracer_) tracer_->finish();  // a run stopped before the last traced step
  if (profiler_) profiler_->finish();
  // "end" means train.steps were reached: a run stopped by a signal resumes
  // later and appends to the same file, which then reads as one run.
  if (metrics_ && summary.stopped_by_signal == 0) metrics_->log_end(step_, r.loss);
  if (tensorboard_) tensorboard_->flush();
  summary.steps = step_;
  summary.steps_run = step_ - first_step;
  summary.final_loss = r.loss;
  summary.seconds = seconds_since(start);
  if (summary.steps_run > 1 && timed_seconds > 0.0) {
    summary.tokens_per_s = static_cast<double>(tokens_per_step() * (summary.steps_run - 1)) / timed_seconds;
  }
  return summary;
}

EvalResult Trainer::evaluate_checkpoint() {
  if (!resumed_) throw no_checkpoint_to_score();
  const EvalResult e = evaluate();
  if (metrics_) metrics_->log_eval(step_, e.loss, e.accuracy, e.perplexity);
  log_eval(e);  // not in TensorBoard, whose steps are the training's: a second value at a step it may have
  return e;
}

// What a run is about to do, once, before its first step (rank 0).
void Trainer::log_run_facts() const {
  if (options_.console == nullptr) return;
  const config::Train& t = config_.train();
  const sharding::MemoryStats& m = engine_->memory();
  const int world = comm_->world_size();
  const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
  *options_.console << fmt::format(
      "run: {:.2f}M parameters | model state {:.1f} MiB per rank at ZeRO stage {} (params {:.1f}, grads {:.1f}, "
      "moments {:.1f}) | global batch {} samples = {} tokens (micro-batch {} x accumulation {} x {} rank{}) | data: "
      "{} train samples, {} held out | config {}\n",
      static_cast<double>(layout_.total_numel()) / 1e6, mib(m.model_state_bytes()), engine_->stage(),
      mib(m.param_bytes), mib(m.grad_bytes), mib(m.optimizer_bytes),
      static_cast<std::int64_t>(t.micro_batch_size()) * t.grad_accum_steps() * world, tokens_per_step(),
      t.micro_batch_size(), t.grad_accum_steps(), world, world == 1 ? "" : "s", train_samples_, val_samples_,
      config_file_.empty() ? std::string("(not written)") : config_file_.string());
  if (config_.device() != "cuda" && compute_dtype(config_) == DType::bf16 && nn::cpu::widens(DType::bf16)) {
    *options_.console << "note: this CPU has no bf16 matrix kernels (AVX512-BF16 or AMX): precision bf16 runs its "
                         "matrix products on operands widened to f32, no faster than fp32\n";
  }
  options_.console->flush();
}

// A line per committed checkpoint (sync saves at once, async ones when they
// commit), and the same figures for /metrics.
void Trainer::note_saves() {
  const SaveTimes& save = checkpointer_->last_save();
  if (save.step < 0 || save.step == live_save_step_) return;
  live_save_step_ = save.step;
  if (options_.live_metrics != nullptr) options_.live_metrics->record_checkpoint(save.write_s, save.blocked_s);
  if (options_.console == nullptr) return;
  *options_.console << fmt::format("{}checkpoint step {} saved in {}: {:.1f} MB (rank 0's file) written in {:.2f} s, "
                                   "training blocked {:.2f} s ({})\n",
                                   timestamp(), save.step, checkpointer_->root().string(),
                                   static_cast<double>(save.bytes) / 1e6, save.write_s, save.blocked_s,
                                   config_.checkpoint().async() ? "async" : "sync");
  options_.console->flush();
}

// "2026-12-03T11:55:01Z " when train.log_timestamps is on, else "".
std::string Trainer::timestamp() const {
  if (!config_.train().log_timestamps()) return "";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ ", &tm);
  return buf;
}

void Trainer::log_progress(const StepResult& r, double tokens_per_s, double step_ms, double elapsed,
                           std::int64_t steps_run) {
  if (options_.console == nullptr) return;
  const std::int64_t total = config_.train().steps();
  const double eta = elapsed / static_cast<double>(steps_run) * static_cast<double>(total - r.step);
  // Model FLOP/s of one rank, and over its peak when --peak-flops gave one.
  const double flops = model_config_.flops_per_token(seq_) * tokens_per_s / comm_->world_size();
  std::string rate = flops >= 1e12 ? fmt::format("{:.2f} TFLOP/s", flops / 1e12)
                                   : fmt::format("{:.2f} GFLOP/s", flops / 1e9);
  if (options_.peak_flops > 0.0) rate += fmt::format(" MFU {:.1f}%", 100.0 * flops / options_.peak_flops);
  std::string memory = fmt::format("RSS {:.0f} MiB", peak_rss_mb());
  if (on_device()) memory += fmt::format(" GPU {:.0f} MiB", static_cast<double>(device_bytes()) / (1024.0 * 1024.0));
  *options_.console << fmt::format(
      "{}step {:>{}}/{} | loss {:.4f} | lr {:.3e} | grad_norm {:.3f} | {:.0f} tok/s | "
      "{:.1f} ms/step | {} | {} | ETA {}\n",
      timestamp(), r.step, std::to_string(total).size(), total, r.loss, r.lr, r.grad_norm, tokens_per_s,
      step_ms, rate, memory, format_duration(eta));
  options_.console->flush();
}

// The figures of metrics.jsonl's step line, and those only TensorBoard gets.
void Trainer::log_tensorboard(const StepResult& r, double tokens_per_s, double step_ms, double exposed_s) {
  if (!tensorboard_) return;
  const double flops = model_config_.flops_per_token(seq_) * tokens_per_s;
  tensorboard_->log_step(r.step, {r.loss, r.lr, r.grad_norm, tokens_per_s, step_ms, flops / 1e12, 1e3 * exposed_s,
                                  peak_rss_mb(), options_.peak_flops > 0.0 ? flops / options_.peak_flops : 0.0});
}

// Every rank asks (ZeRO-3 gathers the parameters with every rank).
bool Trainer::histograms_due(std::int64_t step) const {
  const config::Train& t = config_.train();
  return options_.write_outputs && !t.tensorboard_dir().empty() && t.histogram_every() > 0 &&
         step % t.histogram_every() == 0;
}

void Trainer::log_eval(const EvalResult& e) {
  if (options_.console == nullptr) return;
  std::string extra;
  if (e.accuracy) extra = fmt::format(" | accuracy {:.2f}%", 100.0 * *e.accuracy);
  if (e.perplexity) extra = fmt::format(" | perplexity {:.3f}", *e.perplexity);
  *options_.console << fmt::format("{}eval step {} | loss {:.4f}{}\n", timestamp(), step_, e.loss, extra);
  options_.console->flush();
}

}  // namespace dtrain::worker
