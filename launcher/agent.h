// Agent: what dtrain-launch runs on each node, as an explicit state machine
// (docs/launcher.md):
//
//   INIT        token, the run's store (hosted here or reached), the run id
//               (without --rdzv-id: a fresh one from the store's host)
//   RENDEZVOUS  join a round with the other agents, start this node's workers
//   RUNNING     supervise: worker exits, other nodes' failures, agent beats,
//               hangs (node rank 0 reads every rank's heartbeat), signals,
//               nodes waiting to join (elastic)
//   STOPPING    SIGTERM, --stop-timeout grace, SIGKILL; then a new round
//               (within --max-restarts), or FAILED
//   SUCCEEDED   every worker of every node exited 0
//   FAILED      restarts exhausted, a stop signal, or the store lost
//
// Exit codes of run(): 0 succeeded; 1 the job failed (a summary is printed);
// 128+N stopped on signal N (forwarded to the workers, which save and exit).
// Errors of the launcher itself (usage, port in use, rendezvous timeout)
// throw dtrain::Error; main prints them and exits 2.
//
// One thread (main) runs an agent: worker processes are tied to it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/environment.h"
#include "launcher/console.h"
#include "launcher/hang_monitor.h"
#include "launcher/metrics_exporter.h"
#include "launcher/options.h"
#include "launcher/rendezvous.h"
#include "launcher/store_host.h"
#include "launcher/workers.h"

namespace dtrain::launcher {

enum class AgentState { init, rendezvous, running, stopping, succeeded, failed };
const char* state_name(AgentState state);  // "INIT", "RENDEZVOUS", ...

// Records SIGINT, SIGTERM and SIGUSR1 for the agent to forward. Throws
// IoError when the system refuses the handlers.
void install_launcher_signals();

class Agent {
 public:
  Agent(LaunchOptions options, cluster::EnvMap env, Console& console);
  ~Agent();
  int run();

 private:
  AgentState init();
  AgentState rendezvous();
  AgentState running();
  AgentState stopping();
  AgentState finish(AgentState final_state);

  void resolve_run_id();
  void say_start_notes();
  void start_workers();
  std::map<std::string, std::string> worker_environment() const;
  // One health check of the round; a RoundEnd when it is over.
  std::optional<RoundEnd> check_round(bool local_done);
  std::optional<RoundEnd> check_peers();
  std::optional<RoundEnd> check_hang();
  // --metrics-port: the workers' snapshots into /metrics (throws CommError).
  void collect_metrics();
  void linger_metrics();
  // The ranks' trace files of the round into one (docs/observability.md).
  void merge_traces();
  std::optional<RoundEnd> on_worker_exits(const std::vector<WorkerExit>& exits);
  RoundEnd record(const RoundEnd& end);
  void print_summary() const;
  void transition(AgentState next);

  LaunchOptions options_;
  cluster::EnvMap env_;
  Console& console_;
  AgentState state_ = AgentState::init;
  std::string token_;
  StoreConnection store_;
  std::unique_ptr<Rendezvous> rdzv_;
  RoundPlan plan_;
  std::unique_ptr<WorkerGroup> workers_;
  std::unique_ptr<HangMonitor> hang_;
  std::unique_ptr<MetricsExporter> metrics_;
  std::vector<std::int64_t> peer_beats_;
  std::vector<std::chrono::steady_clock::time_point> peer_beat_at_;
  RoundEnd end_;                    // why the current round ended
  std::vector<RoundEnd> failures_;  // every failed round, in order
  int restarts_ = 0;
  int master_port_ = 0;             // the workers' MASTER_PORT in this round
  bool first_round_ = true;
  bool unwatched_said_ = false;     // said once that no worker heartbeats
  bool store_lost_ = false;         // the store stopped answering: finish() asks it nothing more
  int exit_code_ = 0;
};

}  // namespace dtrain::launcher
