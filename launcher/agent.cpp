#include "launcher/agent.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "cluster/run_token.h"
#include "comm/etcd_store.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/syscall.h"
#include "launcher/error_file.h"
#include "launcher/trace_merge.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::atomic<int> g_signal{0};
std::atomic<int> g_signal_count{0};

extern "C" void on_launcher_signal(int signal) {
  g_signal = signal;
  ++g_signal_count;
}

// Thrown from the rendezvous' wait when a stop signal arrives.
struct Interrupted {
  int signal;
};

milliseconds ms(double seconds) { return milliseconds(static_cast<long>(seconds * 1000.0)); }

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

bool is_number(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

const char* state_name(AgentState state) {
  switch (state) {
    case AgentState::init: return "INIT";
    case AgentState::rendezvous: return "RENDEZVOUS";
    case AgentState::running: return "RUNNING";
    case AgentState::stopping: return "STOPPING";
    case AgentState::succeeded: return "SUCCEEDED";
    case AgentState::failed: return "FAILED";
  }
  return "?";
}

void install_launcher_signals() {
  struct sigaction action {};
  action.sa_handler = on_launcher_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) DTRAIN_SYSCALL(::sigaction(s, &action, nullptr));
}

Agent::Agent(LaunchOptions options, cluster::EnvMap env, Console& console)
    : options_(std::move(options)), env_(std::move(env)), console_(console) {}

Agent::~Agent() = default;

void Agent::transition(AgentState next) { state_ = next; }

int Agent::run() {
  while (state_ != AgentState::succeeded && state_ != AgentState::failed) {
    switch (state_) {
      case AgentState::init: transition(init()); break;
      case AgentState::rendezvous: transition(rendezvous()); break;
      case AgentState::running: transition(running()); break;
      case AgentState::stopping: transition(stopping()); break;
      default: break;
    }
  }
  return exit_code_;
}

AgentState Agent::init() {
  token_ = run_token(options_, env_);
  store_ = open_run_store(options_, token_);
  resolve_run_id();
  const std::string host = options_.local_addr.empty() ? hostname() : options_.local_addr;
  NodeInfo self{store_.server != nullptr, options_.node_rank.value_or(-1), options_.nproc_per_node, host, 0};
  RendezvousOptions ro{options_.min_nodes, options_.max_nodes, ms(options_.rdzv_timeout_s), ms(options_.last_call_s),
                       [] {
                         if (const int sig = g_signal.exchange(0); sig != 0) throw Interrupted{sig};
                       }};
  rdzv_ = std::make_unique<Rendezvous>(std::make_shared<comm::PrefixStore>(options_.run_id + "/launch", store_.store),
                                       ro, self);
  if (store_.server) console_.say(fmt::format("hosting the run's store on {}:{}", options_.endpoint_host, options_.endpoint_port));
  say_start_notes();
  std::filesystem::create_directories(options_.log_dir);
  if (options_.metrics_port > 0) {
    metrics_ = std::make_unique<MetricsExporter>(options_.metrics_host, options_.metrics_port,
                                                 ms(options_.monitor_interval_s), console_);
    metrics_->set_peak_flops(options_.peak_flops);
    metrics_->set_run_id(options_.run_id);
    console_.say(fmt::format("serving /metrics on http://{}:{}/metrics", options_.metrics_host, metrics_->port()));
  }
  return AgentState::rendezvous;
}

// Without --rdzv-id (or Slurm's job id) every job gets a fresh id, as
// torchrun's: the agent hosting the store makes it and publishes the run id
// there, and the others take it from there, so every node of the job agrees
// (and a later job in the same log folder or Prometheus is told apart).
void Agent::resolve_run_id() {
  if (options_.etcd) return;  // every agent gave it (--rdzv-id or Slurm's job id): nobody hosts a store to make one
  const bool fresh = options_.run_id.empty();
  const std::string key = "dtrain-launch/run_id";
  if (store_.server) {
    if (fresh) options_.run_id = cluster::random_token().substr(0, 12);
    store_.store->set(key, comm::to_bytes(options_.run_id));
  } else {
    const std::string hosts = comm::to_string(store_.store->get(key, ms(options_.rdzv_timeout_s)));
    if (!fresh && hosts != options_.run_id) {
      throw Error(fmt::format("--rdzv-id {} differs from the run id {} of the agent hosting the store: give every "
                              "node the same --rdzv-id, or none",
                              options_.run_id, hosts));
    }
    options_.run_id = hosts;
  }
  if (fresh) console_.say(fmt::format("run id {} (fresh for this job; --rdzv-id chooses one)", options_.run_id));
}

// What the user should know before the workers start: choices made for them
// and torchrun options that dtrain answers its own way.
void Agent::say_start_notes() {
  if (!is_number(options_.nproc_spec)) {
    console_.say(fmt::format("--nproc-per-node {}: {} worker(s) on this node", options_.nproc_spec,
                             options_.nproc_per_node));
  }
  if (defaults_omp_threads(options_, env_)) {
    console_.say(fmt::format("setting OMP_NUM_THREADS=1 for each worker, as torchrun does ({} share this node and "
                             "OMP_NUM_THREADS is unset; dtrain-worker splits the cores between its ranks "
                             "itself); set OMP_NUM_THREADS to choose",
                             options_.nproc_per_node));
  }
  if (options_.command.front() == "python3") {
    const auto path = env_.find("PATH");
    const auto python = find_program("python3", path != env_.end() ? path->second : "");
    console_.say(python ? fmt::format("the workers run python3 from {} (the first on PATH)", python->string())
                        : std::string("no python3 on PATH: the workers cannot start; put one on PATH"));
  }
  for (const std::string& note : options_.notes) console_.say(note);
}

AgentState Agent::rendezvous() {
  console_.say(fmt::format("waiting for {} node(s) at {} (run {})",
                           options_.elastic() ? fmt::format("{}-{}", options_.min_nodes, options_.max_nodes)
                                              : std::to_string(options_.min_nodes),
                           options_.etcd ? "etcd " + cluster::host_port_list(options_.etcd_endpoints)
                                         : fmt::format("{}:{}", options_.endpoint_host, options_.endpoint_port),
                           options_.run_id));
  try {
    plan_ = rdzv_->join();
    master_port_ = rdzv_->master_port(plan_, free_tcp_port);
  } catch (const Interrupted& stop) {
    console_.say(fmt::format("stopped by {} while waiting for the other nodes", signal_name(stop.signal)));
    exit_code_ = kExitSignalBase + stop.signal;
    return AgentState::failed;
  }
  start_workers();
  return AgentState::running;
}

std::map<std::string, std::string> Agent::worker_environment() const {
  WorkerRound round;
  round.token = token_;
  round.master_port = master_port_;
  round.restarts = restarts_;
  round.heartbeat_s = options_.hang_timeout_s > 0 || metrics_ ? options_.monitor_interval_s : 0.0;
  round.metrics = metrics_ != nullptr;
  return worker_base_environment(options_, plan_, env_, round);
}

void Agent::start_workers() {
  const int first = plan_.rank_base, last = plan_.rank_base + options_.nproc_per_node - 1;
  console_.say(fmt::format("round {}: node {} of {}, ranks {}-{} of {}{}", plan_.round, plan_.node_rank,
                           plan_.num_nodes, first, last, plan_.world_size,
                           restarts_ > 0 ? fmt::format(" (restart {} of {})", restarts_, options_.max_restarts) : ""));
  std::vector<WorkerSpec> specs;
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    const int rank = first + local;
    const auto error_file = prepare_error_file(options_.log_dir, options_.run_id, plan_.round, rank);
    specs.push_back({rank, worker_rank_environment(rank, local, error_file.string())});
    const auto log = std::filesystem::path(options_.log_dir) / fmt::format("rank_{}.log", rank);
    if (first_round_) {
      keep_previous_log(log);
    } else {
      std::ofstream(log, std::ios::app) << fmt::format("----- dtrain-launch: round {} -----\n", plan_.round);
    }
  }
  first_round_ = false;
  workers_ = std::make_unique<WorkerGroup>(console_);
  workers_->start(options_.command, worker_environment(), specs, options_.log_dir);
  const std::vector<pid_t> pids = workers_->pids();
  for (std::size_t i = 0; i < pids.size(); ++i) {
    console_.say(fmt::format("round {}: rank {} is pid {}", plan_.round, specs[i].rank, pids[i]));
  }
  const auto now = Clock::now();
  peer_beats_.assign(static_cast<std::size_t>(plan_.num_nodes), -1);
  peer_beat_at_.assign(static_cast<std::size_t>(plan_.num_nodes), now);
  hang_.reset();
  if (metrics_) metrics_->start_round(plan_.round, plan_.world_size, restarts_);
  if (plan_.node_rank == 0 && options_.hang_timeout_s > 0) {
    const milliseconds stale = std::max(milliseconds(2000), ms(3 * options_.monitor_interval_s));
    hang_ = std::make_unique<HangMonitor>(plan_.world_size, ms(options_.hang_timeout_s), stale, now);
  }
}

RoundEnd Agent::record(const RoundEnd& end) {
  try {
    return rdzv_->end_round(plan_.round, end);
  } catch (const Error&) {
    return end;  // the store is gone: what this node saw is all there is
  }
}

AgentState Agent::running() {
  auto next_check = Clock::now();
  bool local_done = false;
  for (;;) {
    if (const int sig = g_signal.exchange(0); sig != 0) {
      workers_->signal_all(sig);
      console_.say(fmt::format("received {}; forwarded to the workers (they save a checkpoint and exit)",
                               signal_name(sig)));
      end_ = record({RoundEnd::Kind::stopped,
                     fmt::format("stopped by {} sent to the agent of node {}", signal_name(sig), plan_.node_rank), "",
                     sig});
      return AgentState::stopping;
    }
    if (auto end = on_worker_exits(workers_->reap())) {
      end_ = record(*end);
      return AgentState::stopping;
    }
    if (!local_done && workers_->all_succeeded()) {
      local_done = true;
      workers_->finish_logs();
      rdzv_->mark_succeeded(plan_.round);
    }
    if (Clock::now() >= next_check) {
      next_check = Clock::now() + ms(options_.monitor_interval_s);
      std::optional<RoundEnd> end;
      try {
        if (local_done && rdzv_->succeeded(plan_.round) >= plan_.num_nodes) return finish(AgentState::succeeded);
        end = check_round(local_done);
        if (!end) collect_metrics();
      } catch (const CommError& e) {
        end = RoundEnd{RoundEnd::Kind::failure, fmt::format("lost the run's store: {}", e.what()), "", 0};
        failures_.push_back(*end);
        store_lost_ = true;
        if (options_.etcd) {
          // The workers' SIGTERM makes them save a checkpoint: training resumes from it.
          console_.say(fmt::format(
              "job stopped: lost the run's store in etcd ({}); stopping the workers, which save a checkpoint; once "
              "etcd answers again, start the job again with another --rdzv-id (or after `etcdctl del --prefix "
              "dtrain/{}/`): it resumes from that checkpoint",
              e.what(), options_.run_id));
        }
        workers_->stop(ms(options_.stop_timeout_s));
        exit_code_ = kExitFailed;
        return finish(AgentState::failed);
      }
      if (end) {
        end_ = *end;
        return AgentState::stopping;
      }
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
}

void Agent::collect_metrics() {
  if (!metrics_ || !workers_) return;
  try {
    metrics_->collect(*store_.store, fmt::format("{}/round{}", options_.run_id, plan_.round), workers_->running(),
                      Clock::now());
  } catch (const TimeoutError&) {
    // a slow store answer: the page keeps the last figures until the next interval
  }
}

void Agent::merge_traces() {
  if (plan_.node_rank != 0 || rdzv_ == nullptr || plan_.world_size == 0) return;
  try {
    const std::optional<std::string> merged =
        merge_round_traces(*store_.store, fmt::format("{}/round{}", options_.run_id, plan_.round), plan_.world_size);
    if (merged) console_.say(fmt::format("merged the ranks' traces into {}", *merged));
  } catch (const Error& e) {
    console_.say(fmt::format("could not merge the ranks' traces: {}", e.what()));
  }
}

AgentState Agent::stopping() {
  if (end_.kind == RoundEnd::Kind::failure) {
    // A failed round cannot save: every save is collective and a rank is
    // gone or stuck. The survivors resume from the last checkpoint anyway,
    // so they are stopped at once rather than after a grace they cannot use.
    console_.say(fmt::format("round {} ended: {}; stopping workers", plan_.round, end_.headline));
    workers_->stop(ms(0), SIGKILL);
  } else {
    const int first = end_.kind == RoundEnd::Kind::stopped && end_.signal != 0 ? end_.signal : SIGTERM;
    console_.say(fmt::format("round {} ended: {}; stopping workers (grace {:.0f} s)", plan_.round, end_.headline,
                             options_.stop_timeout_s));
    workers_->stop(ms(options_.stop_timeout_s), first);
  }
  if (end_.kind == RoundEnd::Kind::stopped) {
    console_.say(fmt::format("workers {}; exiting as stopped by {}",
                             workers_->all_succeeded() ? "saved and exited" : "did not all exit cleanly",
                             signal_name(end_.signal)));
    exit_code_ = kExitSignalBase + end_.signal;
    return finish(AgentState::failed);
  }
  if (end_.kind == RoundEnd::Kind::failure) {
    failures_.push_back(end_);
    if (restarts_ >= options_.max_restarts) {
      exit_code_ = kExitFailed;
      print_summary();
      return finish(AgentState::failed);
    }
    ++restarts_;
  }
  rdzv_->advance(plan_.round);
  return AgentState::rendezvous;
}

// The hosting agent keeps the store up until every agent saw the end (bounded).
AgentState Agent::finish(AgentState final_state) {
  if (final_state == AgentState::succeeded) console_.say("all workers of every node finished");
  if (store_lost_) {  // every call would only wait for its timeout
    linger_metrics();
    return final_state;
  }
  try {
    collect_metrics();  // the workers' last snapshots, published as they ended
  } catch (const Error&) {
    // the store is gone: the page keeps what it had
  }
  merge_traces();
  try {
    const std::int64_t left = rdzv_->mark_left(plan_.round);
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (store_.server && rdzv_->left(plan_.round) < plan_.num_nodes && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    // etcd outlives the job: the last agent to leave removes the job's keys,
    // so that the run id can be used again.
    auto* etcd = dynamic_cast<comm::EtcdStore*>(store_.store.get());
    if (etcd != nullptr && left >= plan_.num_nodes) etcd->delete_prefix(options_.run_id + "/");
  } catch (const Error&) {
    // the store is gone already: nothing left to wait for
  }
  linger_metrics();
  return final_state;
}

// --metrics-linger: the final values stay up for a last scrape; a signal to
// the agent ends the wait.
void Agent::linger_metrics() {
  if (!metrics_ || options_.metrics_linger_s <= 0) return;
  console_.say(fmt::format("serving the final values on /metrics for {} s more (--metrics-linger)",
                           options_.metrics_linger_s));
  const auto until = Clock::now() + ms(options_.metrics_linger_s);
  while (Clock::now() < until && g_signal.load() == 0) std::this_thread::sleep_for(milliseconds(50));
}

}  // namespace dtrain::launcher
