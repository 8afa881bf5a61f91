// dtrain-launch's /metrics (--metrics-port): an HTTP server
// (telemetry/metrics_http.h) over the job's metrics, which the agent collects
// every monitor interval from the workers' snapshots in the store
// (telemetry/metrics_snapshot.h) and renders in the Prometheus format
// (telemetry/metrics_render.h). Names the stragglers on the
// console when the set changes.
//
// Threading: start_round() and collect() on the agent's thread (they use its
// store connection); scrapes are answered on the server's thread from the
// last collected state, under a lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store.h"
#include "launcher/console.h"
#include "telemetry/metrics_http.h"
#include "telemetry/metrics_render.h"

namespace dtrain::launcher {

class MetricsExporter {
 public:
  using Clock = std::chrono::steady_clock;

  // Listens on host:port (throws dtrain::Error when it cannot). `interval`:
  // the workers' publication period; a rank is up while its snapshot changed
  // within max(2 s, 3 intervals).
  MetricsExporter(const std::string& host, int port, std::chrono::milliseconds interval, Console& console);
  int port() const { return server_->port(); }

  // A new round of `world_size` ranks; snapshots of earlier rounds are dropped.
  void start_round(int round, int world_size, int restarts);
  // Reads "<round_prefix>/metrics/<rank>" for every rank from `store`.
  // Throws CommError when the store is lost.
  void collect(comm::Store& store, const std::string& round_prefix, int local_running, Clock::time_point now);

  std::string render();
  // One worker's peak FLOP/s (the GPU's or the CPU's): with it the page has dtrain_mfu.
  void set_peak_flops(double peak_flops_per_worker);
  // The run id every series is labelled with (run_id="...").
  void set_run_id(const std::string& run_id);

 private:
  void name_stragglers(const telemetry::JobMetrics& job);

  Console& console_;
  std::chrono::milliseconds stale_;
  std::mutex mu_;
  telemetry::JobMetrics job_;                         // guarded by mu_
  std::vector<Clock::time_point> changed_at_;         // agent thread only
  std::vector<int> stragglers_;                       // agent thread only
  std::unique_ptr<telemetry::MetricsServer> server_;  // last: stops before the state it reads goes
};

}  // namespace dtrain::launcher
