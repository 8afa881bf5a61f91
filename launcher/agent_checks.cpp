// How a round ends and how a failure is told: a worker's exit, a peer agent
// gone quiet, a hang in the workers' heartbeats, a node waiting to join; and
// the summary of a failed job (docs/launcher.md, "Failures and the summary").
#include "launcher/agent.h"

#include <sys/wait.h>

#include <filesystem>

#include <fmt/format.h>

#include "comm/store.h"
#include "launcher/error_file.h"
#include "telemetry/heartbeat_format.h"

namespace dtrain::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds ms(double seconds) { return milliseconds(static_cast<long>(seconds * 1000.0)); }

std::string indent(const std::string& text) {
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t nl = text.find('\n', start);
    const std::size_t end = nl == std::string::npos ? text.size() : nl;
    out += "    " + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

// Within one look, a death by signal or an odd exit code says more than
// exit code 2, which is how workers leave after another rank's failure.
int severity(const WorkerExit& e) {
  if (WIFSIGNALED(e.status)) return 2;
  return WIFEXITED(e.status) && WEXITSTATUS(e.status) == 2 ? 0 : 1;
}

}  // namespace

// A worker that failed ends the round: stop the others first (their last
// lines reach the logs), then describe the failure with its log's tail.
std::optional<RoundEnd> Agent::on_worker_exits(const std::vector<WorkerExit>& exits) {
  const WorkerExit* worst = nullptr;
  for (const WorkerExit& e : exits) {
    if (!e.ok() && (worst == nullptr || severity(e) > severity(*worst))) worst = &e;
  }
  if (worst == nullptr) return std::nullopt;
  const WorkerExit failed = *worst;
  console_.say(fmt::format("rank {} failed ({}); stopping the other workers", failed.rank, failed.describe()));
  workers_->stop(ms(options_.stop_timeout_s));
  const auto log = std::filesystem::path(options_.log_dir) / fmt::format("rank_{}.log", failed.rank);
  std::string details;
  // A PyTorch program under torchrun's @record said why in its error file.
  const auto error_file = error_file_path(options_.log_dir, options_.run_id, plan_.round, failed.rank);
  if (const auto message = read_error_message(error_file)) {
    details = fmt::format("error file {}: {}\n", error_file.string(), *message);
  }
  details += fmt::format("last lines of {}:\n{}", log.string(), indent(tail_lines(log, 15)));
  return RoundEnd{RoundEnd::Kind::failure,
                  fmt::format("rank {} (node {}, host {}, pid {}) failed: {}", failed.rank, plan_.node_rank,
                              plan_.nodes[plan_.node_rank].host, failed.pid, failed.describe()),
                  details, 0};
}

std::optional<RoundEnd> Agent::check_round(bool local_done) {
  rdzv_->beat(plan_);
  if (auto end = rdzv_->round_end(plan_.round)) return end;
  if (auto end = check_peers()) return record(*end);
  if (!local_done) {
    if (auto end = check_hang()) return record(*end);
  }
  if (options_.elastic() && plan_.num_nodes < options_.max_nodes && rdzv_->waiting(plan_.round) > 0) {
    return record({RoundEnd::Kind::membership, "a node is waiting to join; re-forming the job", "", 0});
  }
  return std::nullopt;
}

// An agent whose beat stopped (killed, its machine gone) ends the round.
std::optional<RoundEnd> Agent::check_peers() {
  const auto now = Clock::now();
  const milliseconds lost = std::max(milliseconds(15'000), ms(10 * options_.monitor_interval_s));
  const std::vector<std::int64_t> beats = rdzv_->beats(plan_);
  for (std::size_t n = 0; n < beats.size(); ++n) {
    if (beats[n] != peer_beats_[n]) {
      peer_beats_[n] = beats[n];
      peer_beat_at_[n] = now;
    } else if (static_cast<int>(n) != plan_.node_rank && now - peer_beat_at_[n] > lost) {
      return RoundEnd{RoundEnd::Kind::failure,
                      fmt::format("the agent of node {} (host {}) stopped beating for {:.0f} s: it or its machine "
                                  "is gone", n, plan_.nodes[n].host, std::chrono::duration<double>(lost).count()),
                      "", 0};
    }
  }
  return std::nullopt;
}

std::optional<RoundEnd> Agent::check_hang() {
  if (!hang_) return std::nullopt;
  const auto now = Clock::now();
  for (int rank = 0; rank < plan_.world_size; ++rank) {
    const std::string key = fmt::format("{}/round{}/heartbeat/{}", options_.run_id, plan_.round, rank);
    std::optional<telemetry::HeartbeatRecord> h;
    if (store_.store->check(key)) {
      h = telemetry::parse_heartbeat(comm::to_string(store_.store->get(key, milliseconds(5000))));
    }
    hang_->observe(rank, h, now);
  }
  if (!unwatched_said_ && hang_->unwatched(now)) {
    unwatched_said_ = true;
    console_.say(fmt::format("no worker sent a heartbeat within --hang-timeout {} s: hang detection watches only "
                             "workers that heartbeat (dtrain-worker does; a PyTorch program does not)",
                             options_.hang_timeout_s));
  }
  const std::optional<std::string> report = hang_->check(now);
  if (!report) return std::nullopt;
  console_.say(*report);
  const std::size_t nl = report->find('\n');
  return RoundEnd{RoundEnd::Kind::failure, report->substr(0, nl),
                  nl == std::string::npos ? "" : report->substr(nl + 1), 0};
}

void Agent::print_summary() const {
  std::string text = fmt::format("job failed: {} failure(s), {} restart(s) used of --max-restarts {}\n",
                                 failures_.size(), restarts_, options_.max_restarts);
  for (std::size_t i = 0; i + 1 < failures_.size(); ++i) text += fmt::format("  earlier: {}\n", failures_[i].headline);
  const RoundEnd& last = failures_.back();
  text += fmt::format("  first failure of the last round: {}\n", last.headline);
  if (!last.details.empty()) text += indent(last.details);
  console_.say(text);
}

}  // namespace dtrain::launcher
