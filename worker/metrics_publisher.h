// LiveMetrics: the figures of the running training that /metrics shows
// (telemetry/metrics_snapshot.h). The training thread records each step into
// atomics (no allocation, no lock); snapshot() turns them into the snapshot
// text, which the heartbeat thread publishes in the store for dtrain-launch
// (DTRAIN_METRICS) and the worker's own /metrics server renders
// (dtrain-worker --metrics-port).
//
// Threading: record_* on the training thread only; snapshot() and
// set_communicator() from any thread (serialised by a lock). The collective
// totals outlive the communicator: a snapshot taken after it is gone (the
// heartbeat's last publication) keeps the last totals seen.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "telemetry/metrics_snapshot.h"

namespace dtrain::worker {

struct StepFigures {
  std::int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double step_seconds = 0.0;
  double compute_seconds = 0.0;    // forward and backward, without collective waits
  double data_wait_seconds = 0.0;  // waiting for this step's batches
  double tokens_per_s = 0.0;       // the job's
  double flops_per_s = 0.0;        // the job's model FLOP/s
  double grad_norm = 0.0;          // before clipping
  std::int64_t tokens = 0;         // the job's tokens in this step
};

class LiveMetrics {
 public:
  LiveMetrics(int rank, int world_size) : rank_(rank), world_(world_size) {}

  // The collective totals come from here; it is not kept alive. Setting
  // another (or null) keeps the previous one's final totals.
  void set_communicator(const std::shared_ptr<comm::Communicator>& comm);
  // A step's figures; its tokens add to the total.
  void record_step(const StepFigures& f);
  // A committed checkpoint save (worker/checkpointing.h: SaveTimes).
  void record_checkpoint(double write_seconds, double blocked_seconds);
  // An evaluation's mean loss, and a classifier's accuracy.
  void record_eval(double loss, std::optional<double> accuracy);

  // The snapshot as telemetry::encode_snapshot writes it; compute_s is the
  // mean over the steps since the previous call.
  std::string snapshot();
  telemetry::RankSnapshot snapshot_fields();

 private:
  void keep_collective_totals();  // REQUIRES: mu_ held

  int rank_;
  int world_;
  std::atomic<std::int64_t> step_{0};
  std::atomic<double> loss_{0.0}, lr_{0.0}, step_s_{0.0}, tokens_per_s_{0.0}, flops_{0.0};
  std::atomic<double> compute_total_{0.0}, data_wait_total_{0.0};
  std::atomic<std::int64_t> steps_recorded_{0};
  std::atomic<std::int64_t> saves_{0};
  std::atomic<double> save_s_{0.0}, blocked_s_{0.0};
  std::atomic<double> grad_norm_{0.0};
  std::atomic<std::int64_t> tokens_{0};
  std::atomic<std::int64_t> evals_{0};  // 0: no eval yet
  std::atomic<double> eval_loss_{0.0}, eval_accuracy_{-1.0};  // accuracy < 0: none (an LM)

  std::mutex mu_;
  std::weak_ptr<comm::Communicator> comm_;  // guarded by mu_
  std::int64_t publication_ = 0;             // guarded by mu_
  std::int64_t prev_steps_ = 0;              // guarded by mu_
  double prev_compute_ = 0.0;                // guarded by mu_
  double compute_mean_ = 0.0;                // guarded by mu_
  std::array<telemetry::CollectiveTotals, comm::kOpKinds.size()> last_collectives_{};  // guarded by mu_
};

}  // namespace dtrain::worker
