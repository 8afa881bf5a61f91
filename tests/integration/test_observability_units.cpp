// The pieces of observability without a job: the metrics snapshot's text
// round trip, straggler naming against the median, the rendered page (valid
// for promtool; run_id, gradient norm, tokens, eval, peak RSS; no bus
// bandwidth for a world of one), train.trace_steps parsing, the trace merge,
// and scripts/plot.sh drawing PNGs from a metrics.jsonl.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "integration/observability_testing.h"
#include "launcher/trace_merge.h"
#include "telemetry/metrics_render.h"
#include "telemetry/metrics_snapshot.h"
#include "worker/trace.h"

namespace dtrain::testing {
namespace {

telemetry::RankSnapshot rank_snapshot(int rank, double compute) {
  telemetry::RankSnapshot s;
  s.publication = 3;
  s.rank = rank;
  s.world = 4;
  s.step = 17;
  s.loss = 2.5;
  s.compute_seconds = compute;
  s.collectives[0] = {10, 4096, 0.25};
  return s;
}

TEST(ObservabilityUnits, SnapshotTextRoundTrips) {
  const telemetry::RankSnapshot s = rank_snapshot(2, 0.125);
  const auto back = telemetry::parse_snapshot(telemetry::encode_snapshot(s) + " later_field=7");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->step, 17);
  EXPECT_EQ(back->compute_seconds, 0.125);
  EXPECT_EQ(back->collectives[0].bytes, 4096u);
  EXPECT_FALSE(back->eval_loss.has_value());
  telemetry::RankSnapshot e = s;
  e.grad_norm = 0.75;
  e.tokens = 123456789012;
  e.peak_rss_bytes = 1 << 30;
  e.eval_loss = 3.25;
  e.eval_accuracy = 0.5;
  const auto with_eval = telemetry::parse_snapshot(telemetry::encode_snapshot(e));
  ASSERT_TRUE(with_eval.has_value());
  EXPECT_EQ(with_eval->grad_norm, 0.75);
  EXPECT_EQ(with_eval->tokens, 123456789012);
  EXPECT_EQ(with_eval->peak_rss_bytes, 1 << 30);
  EXPECT_EQ(with_eval->eval_loss, 3.25);
  EXPECT_EQ(with_eval->eval_accuracy, 0.5);
  EXPECT_FALSE(telemetry::parse_snapshot("beat=1 step=2").has_value());
  EXPECT_FALSE(telemetry::parse_snapshot("v=1 step=x").has_value());
}

TEST(ObservabilityUnits, SnapshotAndPageNameTheCollectivesAsCommDoes) {
  telemetry::RankSnapshot s = rank_snapshot(0, 0.01);
  for (const comm::OpKind kind : comm::kOpKinds) s.collective(kind) = {1, 64, 0.5};
  const std::string text = telemetry::encode_snapshot(s);
  telemetry::JobMetrics job;
  job.world_size = 4;
  job.ranks = {s};
  const std::string page = telemetry::render_prometheus(job);
  for (const comm::OpKind kind : comm::kOpKinds) {
    EXPECT_NE(text.find(fmt::format(" {}=1,64,0.5", comm::op_kind_name(kind))), std::string::npos) << text;
    EXPECT_NE(page.find(fmt::format("kind=\"{}\"", comm::op_kind_name(kind))), std::string::npos) << page;
  }
  const auto back = telemetry::parse_snapshot(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->collective(comm::OpKind::barrier).count, 1u);
}

TEST(ObservabilityUnits, StragglersExceedTheMedianByTheFactor) {
  using Ranks = std::vector<std::optional<telemetry::RankSnapshot>>;
  const Ranks two = {rank_snapshot(0, 0.010), rank_snapshot(1, 0.016)};
  EXPECT_EQ(telemetry::find_stragglers(two, 1.5), std::vector<int>{1});  // the lower middle is the median
  const Ranks even = {rank_snapshot(0, 0.010), rank_snapshot(1, 0.014)};
  EXPECT_TRUE(telemetry::find_stragglers(even, 1.5).empty());
  const Ranks four = {rank_snapshot(0, 0.010), std::nullopt, rank_snapshot(2, 0.011), rank_snapshot(3, 0.030)};
  EXPECT_EQ(telemetry::find_stragglers(four, 1.5), std::vector<int>{3});
}

TEST(ObservabilityUnits, RenderedPagePassesPromtool) {
  telemetry::JobMetrics job;
  job.world_size = 2;
  job.workers_up = 2;
  job.ranks = {rank_snapshot(0, 0.01), rank_snapshot(1, 0.05)};
  const std::string page = telemetry::render_prometheus(job);
  EXPECT_NE(page.find("dtrain_rank_straggler{rank=\"1\"} 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("dtrain_collective_bytes_total{rank=\"0\",kind=\"allreduce\"} 4096\n"), std::string::npos);
  telemetry::JobMetrics labelled = job;
  labelled.run_id = "job \"7\"\\x";
  labelled.ranks[0]->eval_loss = 2.5;
  labelled.ranks[0]->eval_accuracy = 0.25;
  const Promtool promtool = find_promtool();
  ASSERT_FALSE(promtool.path.empty()) << promtool.why_not;
  TempDir dir;
  for (const telemetry::JobMetrics& j : {job, labelled, telemetry::JobMetrics{}}) {
    const CommandResult r = promtool_check(promtool, dir, telemetry::render_prometheus(j));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

TEST(ObservabilityUnits, PageHasGradNormTokensEvalPeakRssAndTheRunIdOnEverySample) {
  telemetry::JobMetrics job;
  job.run_id = "run-3";
  job.world_size = 2;
  job.ranks = {rank_snapshot(0, 0.1), rank_snapshot(1, 0.1)};
  job.ranks[0]->grad_norm = 1.5;
  job.ranks[0]->tokens = 4096;
  job.ranks[1]->peak_rss_bytes = 1048576;
  std::string page = telemetry::render_prometheus(job);
  EXPECT_EQ(page.find("dtrain_eval_loss"), std::string::npos) << "no eval yet, no eval series";
  job.ranks[0]->eval_loss = 3.5;
  page = telemetry::render_prometheus(job);
  for (const char* line : {"dtrain_grad_norm{run_id=\"run-3\"} 1.5\n", "dtrain_tokens_total{run_id=\"run-3\"} 4096\n",
                           "dtrain_eval_loss{run_id=\"run-3\"} 3.5\n",
                           "dtrain_rank_peak_rss_bytes{run_id=\"run-3\",rank=\"1\"} 1048576\n",
                           "# TYPE dtrain_tokens_total counter\n"}) {
    EXPECT_NE(page.find(line), std::string::npos) << line << page;
  }
  EXPECT_EQ(page.find("dtrain_eval_accuracy"), std::string::npos) << "an LM has no accuracy";
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind('#', 0) != 0) {
      EXPECT_THAT(line, ::testing::HasSubstr("{run_id=\"run-3\"")) << line;
    }
  }
}

TEST(ObservabilityUnits, AWorldOfOneReportsNoBusBandwidth) {
  telemetry::JobMetrics job;
  job.world_size = 1;
  telemetry::RankSnapshot s = rank_snapshot(0, 0.1);
  s.world = 1;
  for (const comm::OpKind kind : comm::kOpKinds) s.collective(kind) = {3, 1024, 0.5};
  job.ranks = {s};
  const std::string page = telemetry::render_prometheus(job);
  EXPECT_NE(page.find("dtrain_collective_operations_total{rank=\"0\",kind=\"broadcast\"} 3\n"), std::string::npos);
  EXPECT_EQ(page.find("dtrain_collective_busbw_bytes_per_second{"), std::string::npos) << page;
}

TEST(ObservabilityUnits, MfuIsModelFlopsOverEveryWorkersPeak) {
  telemetry::JobMetrics job;
  job.world_size = 2;
  job.ranks = {rank_snapshot(0, 0.1), rank_snapshot(1, 0.1)};
  job.ranks[0]->flops_per_s = 3e12;
  EXPECT_EQ(telemetry::render_prometheus(job).find("dtrain_mfu"), std::string::npos) << "no peak, no MFU";
  job.peak_flops_per_worker = 10e12;
  EXPECT_NE(telemetry::render_prometheus(job).find("\ndtrain_mfu 0.15\n"), std::string::npos)
      << telemetry::render_prometheus(job);
}

TEST(ObservabilityUnits, TraceStepsParse) {
  EXPECT_FALSE(worker::parse_trace_steps("").has_value());
  const auto range = worker::parse_trace_steps("10:15");
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->first, 10);
  EXPECT_EQ(range->last, 15);
  EXPECT_EQ(worker::parse_trace_steps("7")->last, 7);
  for (const char* bad : {"0:3", "5:2", "x", "3:", ":4"}) {
    EXPECT_THROW(worker::parse_trace_steps(bad), ConfigError) << bad;
  }
}

TEST(ObservabilityUnits, TracesMergeWithATrackPerRank) {
  TempDir dir;
  dir.write("a.json", R"({"traceEvents":[{"name":"step","ph":"X","pid":0,"tid":0,"ts":1,"dur":2}]})");
  dir.write("b.json", R"({"dropped":1,"traceEvents":[{"name":"step","ph":"X","pid":1,"tid":0,"ts":1,"dur":3}]})");
  launcher::merge_trace_files({dir / "a.json", dir / "b.json"}, dir / "trace.json");
  std::ifstream in(dir / "trace.json");
  const auto merged = nlohmann::json::parse(in);
  ASSERT_EQ(merged["traceEvents"].size(), 2u);
  EXPECT_EQ(merged["traceEvents"][1]["pid"], 1);
  EXPECT_EQ(merged["dropped"], 1);
  EXPECT_THROW(launcher::merge_trace_files({dir / "missing.json"}, dir / "x.json"), IoError);
}

TEST(ObservabilityUnits, ATraceThatIsNotOneIsAnIoErrorNamingTheFile) {
  TempDir dir;
  const std::pair<const char*, const char*> kBad[] = {
      {"cut.json", R"({"traceEvents":[)"},                    // not JSON
      {"array.json", R"([1, 2])"},                             // not an object
      {"dropped.json", R"({"dropped":"x","traceEvents":[]})"},  // a field of the wrong type
  };
  for (const auto& [name, text] : kBad) {
    const auto path = dir.write(name, text);
    EXPECT_THAT([&] { launcher::merge_trace_files({path}, dir / "trace.json"); },
                ::testing::ThrowsMessage<IoError>(::testing::HasSubstr("the trace '" + path.string() + "'")))
        << name;
  }
}

TEST(ObservabilityUnits, PlotScriptWritesPngs) {
  ASSERT_EQ(run_command("command -v gnuplot").exit_code, 0) << "gnuplot is not installed: scripts/setup.sh installs gnuplot-nox";
  TempDir dir;
  std::string lines;
  for (int step = 1; step <= 20; ++step) {
    lines += fmt::format(R"({{"step":{},"loss":{},"lr":0.001,"grad_norm":1.5,"tokens_per_s":{},"step_ms":12.5}})",
                         step, 4.0 - 0.1 * step, 1000 + 10 * step) + "\n";
    if (step % 10 == 0) lines += fmt::format(R"({{"event":"eval","step":{},"loss":3.1,"accuracy":0.5}})", step) + "\n";
  }
  lines += R"({"event":"end","step":20,"loss":2.0})" "\n";
  dir.write("metrics.jsonl", lines);
  const CommandResult r = run_command(fmt::format("'{}/scripts/plot.sh' '{}'", source_dir(), dir.str()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* png : {"loss.png", "eval.png", "lr.png", "grad_norm.png", "tokens_per_s.png"}) {
    const auto path = dir / "plots" / png;
    ASSERT_TRUE(std::filesystem::exists(path)) << png;
    EXPECT_GT(std::filesystem::file_size(path), 1000u) << png;
    EXPECT_EQ(read_file(path).substr(1, 3), "PNG") << png;
  }
  // A classifier's run (its resolved config says so) is drawn in samples/s.
  dir.write("config.json", "{\n  \"model\": {\n    \"kind\": \"classifier\",\n    \"patch_size\": 7\n  },\n"
                           "  \"data\": {\n    \"kind\": \"fashion_mnist\",\n    \"seq_len\": 0\n  }\n}\n");
  std::filesystem::remove_all(dir / "plots");
  const CommandResult cls = run_command(fmt::format("'{}/scripts/plot.sh' '{}'", source_dir(), dir.str()));
  ASSERT_EQ(cls.exit_code, 0) << cls.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "plots" / "samples_per_s.png")) << cls.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "plots" / "tokens_per_s.png")) << cls.output;
}

}  // namespace
}  // namespace dtrain::testing
