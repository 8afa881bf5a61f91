// The job's metrics in the Prometheus text exposition format (version
// 0.0.4): every family has HELP and TYPE lines, names start with dtrain_,
// units are base units in the name (_seconds, _bytes), counters end in
// _total, every series carries run_id="ID" (when the run has one), per-rank
// series rank="K" and per-collective ones kind="allreduce"
// (docs/observability.md lists them). A world of one reports no bus
// bandwidth: its collectives move nothing.
//
// Stragglers: a rank whose compute time per step exceeds kStragglerFactor
// times the median over the ranks that reported one (for an even number, the
// lower of the two middle values, so that one slow rank of two is named).
//
// Pure functions of their arguments.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "telemetry/metrics_snapshot.h"

namespace dtrain::telemetry {

inline constexpr double kStragglerFactor = 1.5;

struct JobMetrics {
  std::string run_id;          // the run_id label; "" leaves it out
  int world_size = 0;
  int round = 0;
  int restarts = 0;            // restarts of the job so far
  int workers_up = 0;          // ranks whose snapshot was refreshed recently
  int local_workers_running = 0;  // this node's worker processes still running
  double straggler_factor = kStragglerFactor;
  double peak_flops_per_worker = 0.0;  // --peak-flops: one worker's peak FLOP/s; 0 = unknown (no dtrain_mfu)
  std::vector<std::optional<RankSnapshot>> ranks;  // index = rank; nullopt: none seen yet
};

// The ranks (ascending) whose compute_seconds exceeds factor x the median;
// ranks without a snapshot or with no compute time yet are left out.
std::vector<int> find_stragglers(const std::vector<std::optional<RankSnapshot>>& ranks, double factor);

// The whole /metrics page.
std::string render_prometheus(const JobMetrics& job);

}  // namespace dtrain::telemetry
