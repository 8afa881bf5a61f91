#include "launcher/hang_monitor.h"

#include <algorithm>

#include <fmt/format.h>

namespace dtrain::launcher {
namespace {

double seconds(HangMonitor::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

HangMonitor::HangMonitor(int ranks, std::chrono::milliseconds timeout, std::chrono::milliseconds stale,
                         Clock::time_point start)
    : ranks_(static_cast<std::size_t>(ranks), Rank{std::nullopt, start, start}),
      start_(start),
      timeout_(timeout),
      stale_(stale) {}

void HangMonitor::observe(int rank, const std::optional<telemetry::HeartbeatRecord>& h, Clock::time_point now) {
  Rank& r = ranks_.at(static_cast<std::size_t>(rank));
  if (!h) return;
  if (!r.last || r.last->beat != h->beat) r.beat_at = now;
  if (!r.last || r.last->step != h->step || r.last->phase != h->phase || r.last->seq != h->seq) r.progress_at = now;
  r.last = h;
}

std::string HangMonitor::describe(int rank, Clock::time_point now) const {
  const Rank& r = ranks_[static_cast<std::size_t>(rank)];
  if (!r.last) return fmt::format("rank {}: no heartbeat (still starting, or a program that sends none)", rank);
  return fmt::format("rank {}: step {}, phase {}, collective #{}, no progress for {:.1f} s, last heartbeat {:.1f} s ago",
                     rank, r.last->step, r.last->phase, r.last->seq, seconds(now - r.progress_at),
                     seconds(now - r.beat_at));
}

bool HangMonitor::unwatched(Clock::time_point now) const {
  for (const Rank& r : ranks_) {
    if (r.last) return false;
  }
  return now - start_ >= timeout_;
}

std::optional<std::string> HangMonitor::check(Clock::time_point now) const {
  std::optional<Clock::time_point> latest;  // over the ranks that heartbeat
  for (const Rank& r : ranks_) {
    if (r.last) latest = std::max(latest.value_or(r.progress_at), r.progress_at);
  }
  if (!latest || now - *latest < timeout_) return std::nullopt;
  std::uint64_t max_seq = 0;
  for (const Rank& r : ranks_) max_seq = std::max<std::uint64_t>(max_seq, r.last ? r.last->seq : 0);
  std::vector<int> silent, missing, behind, stuck;
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    const Rank& r = ranks_[static_cast<std::size_t>(i)];
    if (!r.last) {
      silent.push_back(i);
    } else if (now - r.beat_at >= stale_) {
      missing.push_back(i);
    } else if (r.last->seq < max_seq) {
      behind.push_back(i);
    } else {
      stuck.push_back(i);
    }
  }
  std::string report = fmt::format("hang: no rank made progress for {:.1f} s (--hang-timeout {:.1f} s)",
                                   seconds(now - *latest), seconds(timeout_));
  if (!missing.empty()) {
    report += fmt::format("; missing: rank(s) {} stopped heartbeating (process stopped, frozen or gone)",
                          join_ranks(missing));
  }
  if (!behind.empty()) {
    report += fmt::format("; behind: rank(s) {} never reached collective #{}", join_ranks(behind), max_seq);
  }
  if (!stuck.empty()) report += fmt::format("; stuck: rank(s) {} waiting", join_ranks(stuck));
  if (!silent.empty()) {
    report += fmt::format("; silent: rank(s) {} never sent a heartbeat (not started yet, or frozen before)",
                          join_ranks(silent));
  }
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) report += "\n  " + describe(i, now);
  return report;
}

}  // namespace dtrain::launcher
