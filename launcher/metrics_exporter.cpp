#include "launcher/metrics_exporter.h"

#include <algorithm>

#include <fmt/format.h>

#include "telemetry/metrics_snapshot.h"

namespace dtrain::launcher {

using telemetry::JobMetrics;

MetricsExporter::MetricsExporter(const std::string& host, int port, std::chrono::milliseconds interval,
                                 Console& console)
    : console_(console), stale_(std::max(std::chrono::milliseconds(2000), 3 * interval)) {
  server_ = std::make_unique<telemetry::MetricsServer>(host, port, [this] { return render(); });
}

void MetricsExporter::start_round(int round, int world_size, int restarts) {
  std::lock_guard<std::mutex> lock(mu_);
  job_.round = round;
  job_.world_size = world_size;
  job_.restarts = restarts;
  job_.workers_up = 0;
  job_.ranks.assign(static_cast<std::size_t>(world_size), std::nullopt);
  changed_at_.assign(static_cast<std::size_t>(world_size), Clock::time_point{});
  stragglers_.clear();
}

void MetricsExporter::collect(comm::Store& store, const std::string& round_prefix, int local_running,
                              Clock::time_point now) {
  JobMetrics job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  int up = 0;
  for (std::size_t rank = 0; rank < job.ranks.size(); ++rank) {
    const std::string key = fmt::format("{}/metrics/{}", round_prefix, rank);
    if (!store.check(key)) continue;
    auto snapshot = telemetry::parse_snapshot(comm::to_string(store.get(key, std::chrono::milliseconds(5000))));
    if (!snapshot) continue;  // a newer worker's format, or garbage: skip it
    snapshot->rank = static_cast<int>(rank);
    if (!job.ranks[rank] || job.ranks[rank]->publication != snapshot->publication) changed_at_[rank] = now;
    job.ranks[rank] = *snapshot;
    if (now - changed_at_[rank] <= stale_) ++up;
  }
  job.workers_up = up;
  job.local_workers_running = local_running;
  name_stragglers(job);
  std::lock_guard<std::mutex> lock(mu_);
  job_ = std::move(job);
}

// A line when the set of stragglers changes, not every interval.
void MetricsExporter::name_stragglers(const JobMetrics& job) {
  const std::vector<int> slow = telemetry::find_stragglers(job.ranks, job.straggler_factor);
  if (slow == stragglers_) return;
  stragglers_ = slow;
  if (slow.empty()) {
    console_.say("metrics: no straggler any more");
    return;
  }
  std::vector<double> times;
  for (const auto& r : job.ranks) {
    if (r && r->compute_seconds > 0.0) times.push_back(r->compute_seconds);
  }
  std::sort(times.begin(), times.end());
  const double median = times[(times.size() - 1) / 2];
  for (int rank : slow) {
    console_.say(fmt::format("metrics: rank {} is a straggler: {:.1f} ms of compute per step, {:.1f}x the median "
                             "{:.1f} ms",
                             rank, 1e3 * job.ranks[static_cast<std::size_t>(rank)]->compute_seconds,
                             job.ranks[static_cast<std::size_t>(rank)]->compute_seconds / median, 1e3 * median));
  }
}

void MetricsExporter::set_peak_flops(double peak_flops_per_worker) {
  std::lock_guard<std::mutex> lock(mu_);
  job_.peak_flops_per_worker = peak_flops_per_worker;
}

void MetricsExporter::set_run_id(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  job_.run_id = run_id;
}

std::string MetricsExporter::render() {
  JobMetrics job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  return telemetry::render_prometheus(job);
}

}  // namespace dtrain::launcher
