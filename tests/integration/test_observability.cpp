// Observability of real jobs: dtrain-launch serves /metrics for a 2-worker
// job (valid for promtool, values moving between scrapes, a rank slowed on
// purpose named a straggler) and merges the ranks' Chrome traces, whose
// events cover every traced step and lie within it; a worker without a
// launcher serves its own /metrics. Timeouts are upper bounds only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "integration/launch_testing.h"
#include "integration/observability_testing.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

// The value of the sample `series` (name with labels) on a /metrics page; -1 when absent.
double sample(const std::string& page, const std::string& series) {
  const auto at = page.find("\n" + series + " ");
  if (at == std::string::npos) return -1.0;
  return std::stod(page.substr(at + series.size() + 2));
}

// `series` of the launched job of run id "dtrain" ("dtrain_step", "dtrain_rank_step{rank=\"1\"}"),
// which carries run_id="dtrain" first.
std::string run_series(const std::string& series) {
  const auto brace = series.find('{');
  if (brace == std::string::npos) return series + "{run_id=\"dtrain\"}";
  return series.substr(0, brace + 1) + "run_id=\"dtrain\"," + series.substr(brace + 1);
}

// Scrapes until `done(page)` holds; the last page (maybe empty) otherwise.
template <typename Done>
std::string scrape_until(int port, Done done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::string page;
  while (std::chrono::steady_clock::now() < until) {
    if (auto body = http_get(port, "/metrics")) {
      page = std::move(*body);
      if (done(page)) break;
    }
    std::this_thread::sleep_for(100ms);
  }
  return page;
}

// One rank's trace: every traced step has one "step" span, forward and
// backward spans of every block, and its training events lie within it; every
// collective lies within a step (or a checkpoint or eval) span of the rank.
void check_rank_trace(const nlohmann::json& trace, int rank, int first, int last, int blocks) {
  std::map<long, std::pair<double, double>> steps;
  std::vector<std::pair<double, double>> spans;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["pid"], rank);
    const std::string name = e["name"];
    const double ts = e["ts"], end = ts + e["dur"].get<double>();
    if (name == "step") steps[e["args"]["step"].get<long>()] = {ts, end};
    if (name == "step" || name == "checkpoint" || name == "eval") spans.emplace_back(ts, end);
  }
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(last - first + 1)) << "rank " << rank;
  for (long s = first; s <= last; ++s) ASSERT_TRUE(steps.count(s)) << "rank " << rank << " step " << s;
  std::map<std::pair<long, std::string>, std::set<int>> blocks_seen;
  int collectives = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    const double ts = e["ts"], end = ts + e["dur"].get<double>();
    if (e["tid"] == 1) {  // the comm thread
      ++collectives;
      EXPECT_GT(e["args"]["bytes"].get<long>(), 0) << name;
      const bool inside = std::any_of(spans.begin(), spans.end(),
                                      [&](const auto& s) { return ts >= s.first - 1.0 && end <= s.second + 1.0; });
      EXPECT_TRUE(inside) << name << " #" << e["args"]["seq"] << " lies outside every step";
      continue;
    }
    if (name == "step" || name == "checkpoint" || name == "eval") continue;
    const long step = e["args"]["step"];
    ASSERT_TRUE(steps.count(step)) << name << " of untraced step " << step;
    EXPECT_GE(ts, steps[step].first - 1.0) << name << " starts before step " << step;
    EXPECT_LE(end, steps[step].second + 1.0) << name << " ends after step " << step;
    if (name == "forward" || name == "backward") blocks_seen[{step, name}].insert(e["args"]["block"].get<int>());
  }
  EXPECT_GE(collectives, last - first + 1) << "rank " << rank << ": no collectives traced";
  for (long s = first; s <= last; ++s) {
    for (const char* phase : {"forward", "backward"}) {
      const std::pair<long, std::string> key{s, phase};
      EXPECT_EQ(blocks_seen[key].size(), static_cast<std::size_t>(blocks)) << phase << " of step " << s;
    }
  }
}

TEST(Observability, LaunchedJobServesMetricsNamesTheStragglerAndMergesTraces) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const int port = free_port();
  const std::string log = dir.file("launch.log");
  auto command = worker_command(config, dir / "run", {"train.steps=400", "train.trace_steps=5:7", "train.eval_every=0"});
  command.insert(command.end(), {"--testonly-slow-rank", "1:15"});
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--rdzv-id", "dtrain", "--monitor-interval",
                              "0.2", "--metrics-port", std::to_string(port), "--log-dir", dir.file("logs")},
                             command, log);
  std::vector<Spawned> procs{launch};

  const std::string step = run_series("dtrain_step");
  const std::string first = scrape_until(port, [&](const std::string& p) { return sample(p, step) >= 1; }, 60s);
  ASSERT_GE(sample(first, step), 1) << first << read_file(log);
  const std::string second = scrape_until(
      port, [&](const std::string& p) { return sample(p, step) > sample(first, step); }, 30s);
  EXPECT_GT(sample(second, step), sample(first, step));
  const std::string allreduces = run_series("dtrain_collective_operations_total{rank=\"1\",kind=\"allreduce\"}");
  EXPECT_GT(sample(second, allreduces), sample(first, allreduces));
  EXPECT_EQ(sample(second, run_series("dtrain_world_size")), 2);
  EXPECT_EQ(sample(second, run_series("dtrain_workers_up")), 2);
  EXPECT_GT(sample(second, run_series("dtrain_collective_busbw_bytes_per_second{rank=\"0\",kind=\"allreduce\"}")),
            0);

  const std::string slow = scrape_until(
      port, [](const std::string& p) { return sample(p, run_series("dtrain_rank_straggler{rank=\"1\"}")) == 1; }, 30s);
  EXPECT_EQ(sample(slow, run_series("dtrain_rank_straggler{rank=\"1\"}")), 1) << slow;
  EXPECT_EQ(sample(slow, run_series("dtrain_rank_straggler{rank=\"0\"}")), 0) << slow;
  EXPECT_FALSE(wait_for_text(log, "metrics: rank 1 is a straggler", 10s).empty()) << read_file(log);

  const Promtool promtool = find_promtool();
  if (promtool.path.empty()) {
    std::cout << "[ SKIPPED promtool part ] " << promtool.why_not << "\n";
  } else {
    for (const std::string* page : {&first, &second, &slow}) {
      const CommandResult r = promtool_check(promtool, dir, *page);
      EXPECT_EQ(r.exit_code, 0) << r.output << *page;
    }
  }

  ASSERT_TRUE(wait_all(procs, 120s)) << read_file(log);
  ASSERT_EQ(procs[0].exit_code(), 0) << read_file(log);
  EXPECT_THAT(read_file(log), HasSubstr("merged the ranks' traces into"));
  const int blocks = 4;  // embeddings, 2 layers, head
  std::size_t events = 0;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / "run" / fmt::format("trace_rank_{}.json", rank));
    const auto trace = nlohmann::json::parse(in);
    SCOPED_TRACE(fmt::format("rank {}", rank));
    check_rank_trace(trace, rank, 5, 7, blocks);
    events += trace["traceEvents"].size();
  }
  std::ifstream in(dir / "run" / "trace.json");
  const auto merged = nlohmann::json::parse(in);
  EXPECT_EQ(merged["traceEvents"].size(), events);
  std::set<int> pids;
  for (const auto& e : merged["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
}

TEST(Observability, FinalValuesStayOnThePageForTheLinger) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const int port = free_port();
  const std::string log = dir.file("launch.log");
  auto launch = start_launch({"--standalone", "--nproc-per-node", "2", "--rdzv-id", "linger-run", "--monitor-interval",
                              "0.2", "--metrics-port", std::to_string(port), "--metrics-linger", "120", "--log-dir",
                              dir.file("logs")},
                             worker_command(config, dir / "run"), log);
  std::vector<Spawned> procs{launch};
  ASSERT_FALSE(wait_for_text(log, "serving the final values on /metrics for 120 s more", 120s).empty())
      << read_file(log);
  const std::optional<std::string> page = http_get(port, "/metrics");
  ::kill(procs[0].pid, SIGTERM);  // ends the linger
  ASSERT_TRUE(wait_all(procs, 30s)) << read_file(log);
  EXPECT_EQ(procs[0].exit_code(), 0) << read_file(log);
  ASSERT_TRUE(page.has_value()) << read_file(log);
  nlohmann::json last_step, last_eval;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("event")) last_step = j;
    if (j.value("event", "") == "eval") last_eval = j;
  }
  const std::string run = "{run_id=\"linger-run\"}";
  EXPECT_EQ(sample(*page, "dtrain_step" + run), 20) << *page;
  EXPECT_EQ(sample(*page, "dtrain_tokens_total" + run), 20 * 4 * 16 * 2) << "steps x micro-batch x seq x ranks";
  EXPECT_DOUBLE_EQ(sample(*page, "dtrain_grad_norm" + run), last_step["grad_norm"].get<double>());
  EXPECT_DOUBLE_EQ(sample(*page, "dtrain_eval_loss" + run), last_eval["loss"].get<double>());
  EXPECT_EQ(sample(*page, "dtrain_local_workers_running" + run), 0);
  for (int rank : {0, 1}) {
    EXPECT_GT(sample(*page, fmt::format("dtrain_rank_peak_rss_bytes{{run_id=\"linger-run\",rank=\"{}\"}}", rank)),
              1e6);
  }
  const Promtool promtool = find_promtool();
  ASSERT_FALSE(promtool.path.empty()) << promtool.why_not;
  const CommandResult r = promtool_check(promtool, dir, *page);
  EXPECT_EQ(r.exit_code, 0) << r.output << *page;
}

TEST(Observability, WorkerWithoutLauncherServesItsOwnMetrics) {
  TempDir dir;
  const auto config = dir.write("lm.json", kLaunchLm);
  const int port = free_port();
  auto argv = worker_command(config, dir / "run", {"train.steps=100000"});
  argv.insert(argv.end(), {"--metrics-port", std::to_string(port)});
  std::vector<Spawned> procs{spawn_process(argv, {}, dir.file("worker.log"))};
  const std::string page =
      scrape_until(port, [](const std::string& p) { return sample(p, "dtrain_step") >= 2; }, 60s);
  ::kill(procs[0].pid, SIGKILL);
  wait_all(procs, 30s);
  ASSERT_GE(sample(page, "dtrain_step"), 2) << page << read_file(dir / "worker.log");
  EXPECT_EQ(sample(page, "dtrain_world_size"), 1);
  EXPECT_GT(sample(page, "dtrain_tokens_per_second"), 0);
  EXPECT_THAT(page, HasSubstr("# TYPE dtrain_collective_seconds_total counter"));
  const Promtool promtool = find_promtool();
  ASSERT_FALSE(promtool.path.empty()) << promtool.why_not;
  const CommandResult r = promtool_check(promtool, dir, page);
  EXPECT_EQ(r.exit_code, 0) << r.output << page;
}

}  // namespace
}  // namespace dtrain::testing
