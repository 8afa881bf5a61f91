// TensorBoard event files of dtrain-worker, read back by TensorBoard itself
// (tests/support/tensorboard_events.py with .venv's tensorboard): every
// scalar as metrics.jsonl has it, the config text, the histograms; a run
// killed with SIGKILL and resumed shows one value per step; our writer's
// bytes equal TensorBoard's EventFileWriter's; and a folder that cannot be
// written, or a full disk, costs one warning, never the run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "nn/transformer.h"
#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "worker/config.h"
#include "worker/tensorboard.h"
#include "worker/trainer.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;
using namespace std::chrono_literals;

// metrics.jsonl's fields and the tags that carry them.
const std::map<std::string, std::string> kStepTags{{"loss", "loss/train"},
                                                    {"lr", "lr"},
                                                    {"grad_norm", "grad_norm"},
                                                    {"tokens_per_s", "throughput/tokens_per_s"},
                                                    {"step_ms", "time/step_ms"}};
const std::map<std::string, std::string> kEvalTags{{"loss", "loss/eval"}, {"perplexity", "eval/perplexity"}};

std::vector<Json> read_jsonl(const std::filesystem::path& p) {
  std::vector<Json> lines;
  std::istringstream in(read_file(p));
  for (std::string line; std::getline(in, line);) lines.push_back(Json::parse(line));
  return lines;
}

// What TensorBoard's EventAccumulator reads in `dir` (tensorboard_events.py).
Json tensorboard_read(const std::filesystem::path& dir, const TempDir& tmp) {
  if (!std::filesystem::exists(venv_python())) {
    throw Error(venv_python() + " is missing: run scripts/setup.sh, which installs TensorBoard into .venv/");
  }
  const std::string out = tmp.file("read.json");
  const CommandResult r = run_command(fmt::format("timeout -s KILL 120 {} {}/tests/support/tensorboard_events.py read {} {}",
                                                  venv_python(), source_dir(), dir.string(), out));
  if (r.exit_code != 0) throw Error("tensorboard_events.py read failed: " + r.output);
  return Json::parse(read_file(out));
}

// step -> value of one tag.
std::map<std::int64_t, double> series(const Json& tb, const std::string& kind, const std::string& tag) {
  std::map<std::int64_t, double> out;
  if (!tb[kind].contains(tag)) return out;
  for (const Json& e : tb[kind][tag]) {
    const auto step = e[0].get<std::int64_t>();
    EXPECT_EQ(out.count(step), 0u) << tag << " has two values at step " << step;
    out[step] = e[1].get<double>();
  }
  return out;
}

std::string tiny_config(const TempDir& dir, int steps) {
  return dir.write("tiny.json", fmt::format(R"({{
  "model": {{"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
            "d_ff": 64, "max_seq_len": 16, "dropout": 0.1}},
  "data": {{"kind": "synthetic", "seq_len": 16}},
  "optimizer": {{"lr": 3e-3}},
  "schedule": {{"warmup_steps": 5}},
  "train": {{"steps": {}, "micro_batch_size": 4, "log_every": 1, "eval_every": 10, "eval_batches": 2,
            "histogram_every": 10}}
}})",
                                            steps))
      .string();
}

// Every scalar of every metrics.jsonl line, as TensorBoard reads it: the
// float32 TensorBoard stores (simple_value) equals the line's double rounded
// to float. For a step logged twice (a resumed run), the last line counts.
void expect_scalars_match_metrics(const Json& tb, const std::vector<Json>& lines) {
  std::map<std::string, std::map<std::int64_t, double>> want;
  for (const Json& line : lines) {
    const bool eval = line.value("event", "") == "eval";
    if (line.contains("event") && !eval) continue;
    for (const auto& [field, tag] : eval ? kEvalTags : kStepTags) want[tag][line["step"]] = line[field].get<double>();
  }
  ASSERT_EQ(want.size(), kStepTags.size() + kEvalTags.size());
  for (const auto& [tag, values] : want) {
    const auto got = series(tb, "scalars", tag);
    ASSERT_EQ(got.size(), values.size()) << tag;
    for (const auto& [step, value] : values) {
      ASSERT_EQ(got.count(step), 1u) << tag << " step " << step;
      EXPECT_EQ(static_cast<float>(got.at(step)), static_cast<float>(value)) << tag << " step " << step;
      EXPECT_EQ(got.at(step), static_cast<double>(static_cast<float>(got.at(step)))) << "a float32 value";
    }
  }
}

TEST(TensorBoard, ReadsBackEveryScalarTheConfigAndTheHistograms) {
  TempDir dir;
  const std::string config = tiny_config(dir, 30);
  const auto out = dir / "run";
  const CommandResult r = run_command(fmt::format("{}/dtrain-worker --config {} --set train.out_dir={}", bin_dir(),
                                                  config, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("warning")));
  const Json tb = tensorboard_read(out / "tensorboard", dir);
  const std::vector<Json> lines = read_jsonl(out / "metrics.jsonl");
  expect_scalars_match_metrics(tb, lines);
  EXPECT_EQ(series(tb, "scalars", "loss/train").size(), 30u);
  for (const char* tag : {"throughput/model_tflops", "memory/peak_rss_mib"}) {
    const auto values = series(tb, "scalars", tag);
    EXPECT_EQ(values.size(), 30u) << tag;
    for (const auto& [step, v] : values) EXPECT_GT(v, 0.0) << tag << " step " << step;
  }
  EXPECT_EQ(series(tb, "scalars", "time/exposed_comm_ms").size(), 30u);
  EXPECT_TRUE(series(tb, "scalars", "throughput/mfu").empty()) << "no peak given, no MFU";

  // The config, as config.json has it, at step 0 (indented: a Markdown code block).
  ASSERT_TRUE(tb["texts"].contains("config")) << tb["texts"].dump();
  ASSERT_EQ(tb["texts"]["config"].size(), 1u);
  EXPECT_EQ(tb["texts"]["config"][0][0], 0);
  std::string text = tb["texts"]["config"][0][1];
  EXPECT_EQ(std::regex_replace(text, std::regex("(^|\n)    "), "$1"), read_file(out / "config.json") + "");

  // Each block's weights and gradients at steps 10, 20, 30, each value counted once.
  const nn::ParameterLayout layout =
      nn::declare_parameters(worker::model_config(worker::load_config(config)));
  for (const nn::BlockSpec& block : layout.blocks()) {
    for (const std::string& tag : {"weights/" + block.name, "grads/" + block.name}) {
      ASSERT_TRUE(tb["histograms"].contains(tag)) << tag;
      const Json& h = tb["histograms"][tag];
      ASSERT_EQ(h.size(), 3u) << tag;
      for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(h[i][0], 10 * (i + 1)) << tag;
        const Json& v = h[i][1];
        EXPECT_EQ(v["num"].get<double>(), static_cast<double>(block.numel)) << tag;
        double total = 0.0;
        for (const Json& count : v["bucket"]) total += count.get<double>();
        EXPECT_EQ(total, static_cast<double>(block.numel)) << tag;
        EXPECT_LE(v["min"].get<double>(), v["max"].get<double>()) << tag;
        EXPECT_GT(v["sum_squares"].get<double>(), 0.0) << tag;
      }
    }
  }
}

// Given a peak (--peak-flops), every logged step also has its MFU: the model
// FLOP/s over the peak.
TEST(TensorBoard, APeakGivesEachStepItsMfu) {
  TempDir dir;
  const auto out = dir / "run";
  const CommandResult r = run_command(fmt::format("{}/dtrain-worker --config {} --peak-flops 1e9 --set train.steps=5 "
                                                  "--set train.out_dir={}",
                                                  bin_dir(), tiny_config(dir, 5), out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json tb = tensorboard_read(out / "tensorboard", dir);
  const auto mfu = series(tb, "scalars", "throughput/mfu");
  const auto tflops = series(tb, "scalars", "throughput/model_tflops");
  ASSERT_EQ(mfu.size(), 5u);
  ASSERT_EQ(tflops.size(), 5u);
  for (const auto& [step, value] : mfu) {
    ASSERT_EQ(tflops.count(step), 1u) << "step " << step;
    EXPECT_NEAR(value, tflops.at(step) * 1e3, 1e-5 * tflops.at(step) * 1e3) << "step " << step;
  }
}

TEST(TensorBoard, AKilledAndResumedRunShowsOneValuePerStep) {
  TempDir dir;
  const std::string config = tiny_config(dir, 30);
  const auto out = dir / "run";
  const std::vector<std::string> args{bin_dir() + "/dtrain-worker", "--config", config, "--set",
                                      "train.out_dir=" + out.string(), "--set", "checkpoint.every_steps=10"};
  std::vector<std::string> slow = args;
  slow.insert(slow.end(), {"--testonly-slow-rank", "0:40"});  // time to kill it between checkpoints
  std::vector<Spawned> first{spawn_process(slow, {}, dir.file("first.log"))};
  ASSERT_FALSE(wait_for_text(first[0].log_path, R"(step 1[4-8]/30)", 60s).empty()) << first[0].log();
  ::kill(first[0].pid, SIGKILL);
  ASSERT_TRUE(wait_all(first, 30s));
  ASSERT_TRUE(first[0].killed_by(SIGKILL)) << first[0].outcome() << first[0].log();

  std::string resume;
  for (const std::string& a : args) resume += a + " ";
  const CommandResult r = run_command(resume);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_THAT(r.output, HasSubstr("resumed from")) << "the checkpoint of step 10";
  ASSERT_THAT(r.output, HasSubstr("(step 10,"));
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(out / "tensorboard")) files.insert(e.path().string());
  EXPECT_EQ(files.size(), 2u) << "the resumed run writes a new file";

  const Json tb = tensorboard_read(out / "tensorboard", dir);
  const std::vector<Json> lines = read_jsonl(out / "metrics.jsonl");
  std::map<std::int64_t, int> logged;
  for (const Json& line : lines) {
    if (!line.contains("event")) ++logged[line["step"].get<std::int64_t>()];
  }
  ASSERT_GT(logged[11], 1) << "metrics.jsonl holds the replaced steps twice";
  expect_scalars_match_metrics(tb, lines);  // one value per step (series() checks), the resumed run's
  const auto loss = series(tb, "scalars", "loss/train");
  ASSERT_EQ(loss.size(), 30u);
  EXPECT_EQ(loss.begin()->first, 1);
  EXPECT_EQ(loss.rbegin()->first, 30);
  // Each session's config: the first run's at step 0, the resumed run's at its first step.
  ASSERT_EQ(tb["texts"]["config"].size(), 2u);
  EXPECT_EQ(tb["texts"]["config"][0][0], 0);
  EXPECT_EQ(tb["texts"]["config"][1][0], 11);

  // Scoring an older step (--eval-only) trains nothing: it drops no step and adds no value.
  const CommandResult eval = run_command(fmt::format("{} --eval-only --set checkpoint.resume={}", resume,
                                                     (out / "checkpoints" / "step_000000010").string()));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const Json after = tensorboard_read(out / "tensorboard", dir);
  EXPECT_EQ(series(after, "scalars", "loss/train"), loss);
  const auto eval_loss = series(after, "scalars", "loss/eval");
  EXPECT_EQ(eval_loss.size(), 3u) << "evals at 10, 20, 30";
}

TEST(TensorBoard, OurBytesAreTensorBoardsOwnWritersForTheSameScalars) {
  TempDir dir;
  constexpr double kWallTime = 1700000000.25;
  Json items = Json::array();
  {
    telemetry::EventFileWriter writer(
        dir / "ours", {.wall_clock = [] { return kWallTime; },
                       .source_writer = "tensorboard.summary.writer.event_file_writer"});
    for (int step = 1; step <= 5; ++step) {
      const std::vector<telemetry::ScalarValue> values{
          {"loss/train", 4.0 / step + 0.1}, {"lr", 3e-4 * step}, {"throughput/tokens_per_s", 1234.5678 * step}};
      writer.add_scalars(step, values);
      Json item{{"step", step}, {"values", Json::array()}};
      for (const auto& v : values) item["values"].push_back({std::string(v.tag), v.value});
      items.push_back(item);
    }
    writer.flush();
  }
  ASSERT_TRUE(std::filesystem::exists(venv_python())) << venv_python() << " is missing: run scripts/setup.sh";
  const auto input = dir.write("scalars.json", items.dump());
  const CommandResult r =
      run_command(fmt::format("timeout -s KILL 120 {} {}/tests/support/tensorboard_events.py write {} {} < {}",
                              venv_python(), source_dir(), dir.file("theirs"), kWallTime, input.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto only_file = [](const std::filesystem::path& d) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(d)) files.push_back(e.path());
    EXPECT_EQ(files.size(), 1u) << d;
    return files.empty() ? std::filesystem::path() : files[0];
  };
  const auto ours = only_file(dir / "ours"), theirs = only_file(dir / "theirs");
  const std::string our_bytes = read_file(ours), their_bytes = read_file(theirs);
  EXPECT_GT(our_bytes.size(), 100u);
  EXPECT_EQ(our_bytes, their_bytes) << "sizes " << our_bytes.size() << " and " << their_bytes.size();
  // The names agree up to the pid and the counter.
  const auto head = [](const std::filesystem::path& p) {
    const std::string n = p.filename().string();
    return n.substr(0, n.find('.', std::string("events.out.tfevents.1700000000.").size()));
  };
  EXPECT_EQ(head(ours), head(theirs));
  EXPECT_THAT(ours.filename().string(), ::testing::StartsWith("events.out.tfevents.1700000000."));
}

TEST(TensorBoard, AFolderThatCannotBeWrittenCostsOneWarningNotTheRun) {
  TempDir dir;
  const std::string config = tiny_config(dir, 12);
  const auto blocker = dir.write("a-file", "not a folder");
  const auto tb_dir = blocker / "tensorboard";
  const CommandResult r =
      run_command(fmt::format("{}/dtrain-worker --config {} --set train.out_dir={} --set train.tensorboard_dir={}",
                              bin_dir(), config, dir.file("run"), tb_dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fmt::format("warning: TensorBoard events in '{}' are off", tb_dir.string())));
  std::size_t warnings = 0;
  for (std::size_t at = r.output.find("warning"); at != std::string::npos; at = r.output.find("warning", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << r.output;
  const std::vector<Json> lines = read_jsonl(dir / "run" / "metrics.jsonl");
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["event"], "end");
  EXPECT_EQ(lines.back()["step"], 12);
}

TEST(TensorBoard, EmptyFolderTurnsEventsOffAndHistogramsNeedThem) {
  TempDir dir;
  const std::string config = tiny_config(dir, 6);
  const CommandResult r =
      run_command(fmt::format("{}/dtrain-worker --config {} --set train.out_dir={} --set train.tensorboard_dir= "
                              "--set train.histogram_every=0",
                              bin_dir(), config, dir.file("run")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "tensorboard"));
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "metrics.jsonl"));
  try {
    worker::load_config(config, {"train.tensorboard_dir="});
    FAIL() << "histogram_every without a folder was accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.histogram_every"));
  }
  const config::Config defaults = worker::load_config(config, {"train.out_dir=/x/run"});
  EXPECT_EQ(defaults.train().tensorboard_dir(), "/x/run/tensorboard");
}

// A full disk (here: the file-size limit, which fails writes the same way)
// turns the log off after one warning naming the folder.
TEST(TensorBoard, AFullDiskCostsOneWarning) {
  TempDir dir;
  std::ostringstream warnings;
  worker::TensorBoardLog log(dir / "tb", std::nullopt, "{}", warnings);
  ASSERT_TRUE(log.on());
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  rlimit small = before;
  small.rlim_cur = 4096;
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  for (int step = 1; step <= 200; ++step) log.log_step(step, {.loss = 1.0 / step});
  ::setrlimit(RLIMIT_FSIZE, &before);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(log.on());
  const std::string text = warnings.str();
  EXPECT_THAT(text, HasSubstr(fmt::format("TensorBoard events in '{}' are off", (dir / "tb").string())));
  EXPECT_EQ(text.find("warning"), text.rfind("warning")) << text;
}

}  // namespace
}  // namespace dtrain::testing
