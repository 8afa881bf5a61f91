// The heartbeat a worker publishes for dtrain-launch's hang detection
// (docs/launcher.md, "Heartbeats"): one line of text at
// "<run id>/round<R>/heartbeat/<rank>" in the run's store, rewritten every
// interval by the worker's heartbeat thread (worker/heartbeat.h) and read
// by the agent's hang monitor (launcher/hang_monitor.h):
//
//   beat=N step=S phase=P seq=Q
//
//   beat   int64   grows with every publication (the process is alive)
//   step   int64   optimizer steps done
//   phase  a word  startup, forward, backward, optimizer, eval, checkpoint
//                  or done (worker::phase_name); read as text
//   seq    uint64  the communicator's last collective (#1, #2, ...; 0
//                  before the first), Communicator::last_seq
//
// Fields as in telemetry/text_fields.h: order-free, unknown keys skipped (so
// a newer worker may add some); all four are required, numbers whole and in
// range. There is no version field: adding fields keeps older readers
// working, changing these four would not.
//
// Pure functions; header-only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "telemetry/text_fields.h"

namespace dtrain::telemetry {

struct HeartbeatRecord {
  std::int64_t beat = 0;
  std::int64_t step = 0;
  std::string phase;
  std::uint64_t seq = 0;
};

inline std::string encode_heartbeat(const HeartbeatRecord& h) {
  return fmt::format("beat={} step={} phase={} seq={}", h.beat, h.step, h.phase, h.seq);
}

// nullopt when `text` is not a heartbeat: a field without '=', one of the
// four missing, a number that is not whole or out of range, an empty phase.
inline std::optional<HeartbeatRecord> parse_heartbeat(std::string_view text) {
  HeartbeatRecord h;
  bool beat = false, step = false, phase = false, seq = false;
  const bool parsed = for_each_field(text, [&](std::string_view key, std::string_view value) {
    if (key == "beat") return beat = parse_number(value, h.beat);
    if (key == "step") return step = parse_number(value, h.step);
    if (key == "seq") return seq = parse_number(value, h.seq);
    if (key == "phase") {
      h.phase = value;
      return phase = !value.empty();
    }
    return true;
  });
  if (!parsed || !beat || !step || !phase || !seq) return std::nullopt;
  return h;
}

}  // namespace dtrain::telemetry
