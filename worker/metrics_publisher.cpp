#include "worker/metrics_publisher.h"

#include <cmath>

#include "comm/op_stats.h"
#include "core/process.h"

namespace dtrain::worker {
namespace {

// The atomics hold only what the training thread wrote last: plain stores.
void add(std::atomic<double>& total, double v) {
  total.store(total.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}

}  // namespace

void LiveMetrics::set_communicator(const std::shared_ptr<comm::Communicator>& comm) {
  std::lock_guard<std::mutex> lock(mu_);
  keep_collective_totals();
  comm_ = comm;
}

void LiveMetrics::keep_collective_totals() {
  if (auto comm = comm_.lock()) {
    for (const comm::OpKind kind : comm::kOpKinds) {
      const comm::OpStats::Totals t = comm->op_stats().totals(kind);
      last_collectives_[static_cast<std::size_t>(kind)] = {t.count, t.bytes, t.seconds};
    }
  }
}

void LiveMetrics::record_step(const StepFigures& f) {
  loss_.store(f.loss, std::memory_order_relaxed);
  lr_.store(f.lr, std::memory_order_relaxed);
  step_s_.store(f.step_seconds, std::memory_order_relaxed);
  tokens_per_s_.store(f.tokens_per_s, std::memory_order_relaxed);
  flops_.store(f.flops_per_s, std::memory_order_relaxed);
  add(compute_total_, f.compute_seconds);
  add(data_wait_total_, f.data_wait_seconds);
  grad_norm_.store(f.grad_norm, std::memory_order_relaxed);
  tokens_.fetch_add(f.tokens, std::memory_order_relaxed);
  step_.store(f.step, std::memory_order_relaxed);
  steps_recorded_.fetch_add(1, std::memory_order_release);  // last: the figures above belong to it
}

void LiveMetrics::record_eval(double loss, std::optional<double> accuracy) {
  eval_loss_.store(loss, std::memory_order_relaxed);
  eval_accuracy_.store(accuracy.value_or(-1.0), std::memory_order_relaxed);
  evals_.fetch_add(1, std::memory_order_release);  // last: the figures above belong to it
}

void LiveMetrics::record_checkpoint(double write_seconds, double blocked_seconds) {
  save_s_.store(write_seconds, std::memory_order_relaxed);
  blocked_s_.store(blocked_seconds, std::memory_order_relaxed);
  saves_.fetch_add(1, std::memory_order_relaxed);
}

telemetry::RankSnapshot LiveMetrics::snapshot_fields() {
  std::lock_guard<std::mutex> lock(mu_);
  telemetry::RankSnapshot s;
  const std::int64_t steps = steps_recorded_.load(std::memory_order_acquire);
  const double compute = compute_total_.load(std::memory_order_relaxed);
  if (steps > prev_steps_) {
    compute_mean_ = (compute - prev_compute_) / static_cast<double>(steps - prev_steps_);
    prev_steps_ = steps;
    prev_compute_ = compute;
  }
  s.publication = ++publication_;
  s.rank = rank_;
  s.world = world_;
  s.step = step_.load(std::memory_order_relaxed);
  s.loss = loss_.load(std::memory_order_relaxed);
  s.lr = lr_.load(std::memory_order_relaxed);
  s.tokens_per_s = tokens_per_s_.load(std::memory_order_relaxed);
  s.step_seconds = step_s_.load(std::memory_order_relaxed);
  s.compute_seconds = compute_mean_;
  s.flops_per_s = flops_.load(std::memory_order_relaxed);
  s.data_wait_seconds = data_wait_total_.load(std::memory_order_relaxed);
  s.checkpoint_saves = saves_.load(std::memory_order_relaxed);
  s.checkpoint_save_seconds = save_s_.load(std::memory_order_relaxed);
  s.checkpoint_blocked_seconds = blocked_s_.load(std::memory_order_relaxed);
  s.grad_norm = grad_norm_.load(std::memory_order_relaxed);
  s.tokens = tokens_.load(std::memory_order_relaxed);
  s.peak_rss_bytes = peak_rss_bytes();
  if (evals_.load(std::memory_order_acquire) > 0) {
    s.eval_loss = eval_loss_.load(std::memory_order_relaxed);
    const double accuracy = eval_accuracy_.load(std::memory_order_relaxed);
    if (accuracy >= 0.0) s.eval_accuracy = accuracy;
  }
  keep_collective_totals();
  s.collectives = last_collectives_;
  return s;
}

std::string LiveMetrics::snapshot() { return telemetry::encode_snapshot(snapshot_fields()); }

}  // namespace dtrain::worker
