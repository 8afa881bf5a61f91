// HangMonitor: decides from the workers' heartbeats (docs/launcher.md
// "Heartbeats") that a round no longer makes progress, and explains it: which
// ranks are stuck, in which phase and collective, and which rank is missing
// (its heartbeat stopped) or behind (an earlier collective).
//
// Only ranks that heartbeat are watched: a rank that never sent one (a
// program other than dtrain-worker, a PyTorch script say, which knows
// nothing of heartbeats) is not stuck, and a round where no rank sent one is
// never a hang. dtrain-worker heartbeats from its start.
//
// A heartbeat (telemetry/heartbeat_format.h) is stored at
// "<run id>/round<R>/heartbeat/<rank>". `beat` grows while the worker's
// process runs; step, phase and seq change when it makes progress.
//
// Pure bookkeeping: the agent feeds observations with their time; not thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "telemetry/heartbeat_format.h"

namespace dtrain::launcher {

class HangMonitor {
 public:
  using Clock = std::chrono::steady_clock;

  // `ranks` workers; a hang is `timeout` without progress on any rank;
  // a rank whose beat has not moved for `stale` is missing.
  HangMonitor(int ranks, std::chrono::milliseconds timeout, std::chrono::milliseconds stale, Clock::time_point start);

  // The rank's latest heartbeat (nullopt: none yet).
  void observe(int rank, const std::optional<telemetry::HeartbeatRecord>& heartbeat, Clock::time_point now);

  // A report when the ranks that heartbeat made no progress for the
  // timeout; nullopt otherwise (always while none has heartbeated).
  std::optional<std::string> check(Clock::time_point now) const;

  // No rank sent a heartbeat within the timeout since the start: nothing is
  // watched (for the agent to say so once).
  bool unwatched(Clock::time_point now) const;

 private:
  struct Rank {
    std::optional<telemetry::HeartbeatRecord> last;
    Clock::time_point beat_at;      // when `beat` last changed (start until the first heartbeat)
    Clock::time_point progress_at;  // when step, phase or seq last changed
  };
  std::string describe(int rank, Clock::time_point now) const;

  std::vector<Rank> ranks_;
  Clock::time_point start_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds stale_;
};

}  // namespace dtrain::launcher
