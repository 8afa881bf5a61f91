// Heartbeat: the worker's side of dtrain-launch's hang detection
// (docs/launcher.md, "Heartbeats"). A thread publishes, every interval, the
// text "beat=N step=S phase=P seq=Q" (telemetry/heartbeat_format.h: beat,
// step, phase, last collective) at "heartbeat/<rank>" in the run's store,
// scoped like the worker's other keys ("<run id>/round<R>/"). The launcher
// reads them and, past --hang-timeout without progress, names the stuck and
// missing ranks.
//
// Off unless DTRAIN_HEARTBEAT_S is set (dtrain-launch sets it). The thread
// uses its own store connection, so a rank waiting in the store (a
// rendezvous) does not hold it up; failures to publish are reported once
// and never stop training.
//
// Threading: set_* may be called from any thread; the destructor publishes
// once more (the final figures, for dtrain-launch's /metrics) and joins the
// thread (within one store round trip).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cluster/environment.h"
#include "comm/communicator.h"
#include "comm/store.h"

namespace dtrain::worker {

enum class Phase { startup, forward, backward, optimizer, eval, checkpoint, done };
const char* phase_name(Phase phase);

class Heartbeat {
 public:
  // A heartbeat when DTRAIN_HEARTBEAT_S (seconds, > 0) is in `vars` and the
  // run has a store; nullptr otherwise. Throws CommError when the store
  // cannot be reached.
  static std::unique_ptr<Heartbeat> from_environment(const cluster::Environment& env, const cluster::EnvMap& vars);

  // Publishes through `store` (already scoped to the run and round) every `interval`.
  Heartbeat(std::shared_ptr<comm::Store> store, int rank, comm::Duration interval);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void set_phase(Phase phase, std::int64_t step);
  // Where seq comes from; the heartbeat does not keep it alive.
  void set_communicator(const std::shared_ptr<comm::Communicator>& comm);
  // With a source, every publication also sets "metrics/<rank>" to its text
  // (telemetry/metrics_snapshot.h; dtrain-launch --metrics-port). The source
  // runs on the heartbeat's thread.
  void set_metrics_source(std::function<std::string()> source);
  // The text the next publication carries (for tests).
  std::string text();

 private:
  void run();

  std::shared_ptr<comm::Store> store_;
  std::string key_;
  comm::Duration interval_;
  std::atomic<int> phase_{static_cast<int>(Phase::startup)};
  std::atomic<std::int64_t> step_{0};
  std::atomic<std::int64_t> beat_{0};
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;                          // guarded by mu_
  std::weak_ptr<comm::Communicator> comm_;         // guarded by mu_
  std::function<std::string()> metrics_source_;   // guarded by mu_
  std::string metrics_key_;
  std::thread thread_;
};

}  // namespace dtrain::worker
