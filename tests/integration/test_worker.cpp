// dtrain-worker end to end: the real binary on small configs, its outputs,
// its error messages, and run-to-run determinism.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <vector>

#include "data/token_shard.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

// A small LM on synthetic tokens: trains in about a second.
const char* kTinyLm = R"({
  "model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
            "d_ff": 64, "max_seq_len": 16, "dropout": 0.1},
  "data": {"kind": "synthetic", "seq_len": 16},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": 5},
  "train": {"steps": 30, "micro_batch_size": 4, "grad_accum_steps": 2, "log_every": 5,
            "eval_every": 10, "eval_batches": 2}
})";

CommandResult worker(const std::string& config, const std::string& args) {
  return run_command(bin_dir() + "/dtrain-worker --config " + config + " " + args);
}

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_file(p));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Worker, TrainsAndWritesConfigAndMetrics) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  const auto out = dir / "run";
  const CommandResult r = worker(config.string(), "--set train.out_dir=" + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 30/30"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("perplexity"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 30 steps"), std::string::npos) << r.output;

  const auto lines = read_jsonl(out / "metrics.jsonl");
  int steps = 0, evals = 0;
  for (const auto& j : lines) {
    if (!j.contains("event")) {
      ++steps;
      for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms"}) {
        EXPECT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
      }
    } else if (j["event"] == "eval") {
      ++evals;
      EXPECT_TRUE(j.contains("perplexity"));
    }
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(evals, 3);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["event"], "end");
  EXPECT_EQ(lines.back()["step"], 30);
  // The loss goes down on the learnable synthetic stream.
  EXPECT_LT(lines.back()["loss"].get<double>(), std::log(64.0) - 0.5);

  // config.json is the resolved config and runs as it is.
  const nlohmann::json resolved = nlohmann::json::parse(read_file(out / "config.json"));
  EXPECT_EQ(resolved["model"]["d_ff"], 64);
  EXPECT_EQ(resolved["train"]["out_dir"], out.string());
}

TEST(Worker, SameSeedGivesBitwiseIdenticalMetrics) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  ASSERT_EQ(worker(config.string(), "--set train.out_dir=" + (dir / "a").string()).exit_code, 0);
  ASSERT_EQ(worker(config.string(), "--set train.out_dir=" + (dir / "b").string()).exit_code, 0);
  auto a = read_jsonl(dir / "a" / "metrics.jsonl");
  auto b = read_jsonl(dir / "b" / "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i].erase("tokens_per_s");  // wall-clock figures differ from run to run
    a[i].erase("step_ms");
    b[i].erase("tokens_per_s");
    b[i].erase("step_ms");
    EXPECT_EQ(a[i].dump(), b[i].dump()) << "line " << i;
  }
  // A different seed trains differently.
  ASSERT_EQ(worker(config.string(),
                   "--set train.seed=7 --set train.out_dir=" + (dir / "c").string())
                .exit_code,
            0);
  auto c = read_jsonl(dir / "c" / "metrics.jsonl");
  EXPECT_NE(a[0]["loss"], c[0]["loss"]);
}

TEST(Worker, RefusesToOverwriteAnEarlierRun) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  const std::string out = "--set train.steps=2 --set schedule.warmup_steps=0 --set train.out_dir=" +
                          (dir / "run").string();
  ASSERT_EQ(worker(config.string(), out).exit_code, 0);
  const std::string before = read_file(dir / "run" / "metrics.jsonl");
  const CommandResult again = worker(config.string(), out);
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.output.find("train.out_dir"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("already holds a finished run"), std::string::npos) << again.output;
  EXPECT_EQ(read_file(dir / "run" / "metrics.jsonl"), before);
}

TEST(Worker, ConfigErrorNamesTheField) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  const std::string out = " --set train.out_dir=" + (dir / "run").string();
  const CommandResult r = worker(config.string(), "--set model.d_model=33" + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("model.d_model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.n_heads"), std::string::npos) << r.output;

  const CommandResult unknown = worker(config.string(), "--set model.d_modle=32" + out);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("d_modle"), std::string::npos) << unknown.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "a failed start must not create out_dir";
}

TEST(Worker, MissingDatasetNamesPathAndPackage) {
  TempDir dir;
  const auto config = dir.write("fm.json", R"({
    "model": {"kind": "classifier", "input": "patches", "patch_size": 4, "d_model": 16,
              "n_heads": 2, "n_layers": 1, "max_seq_len": 49, "num_classes": 10},
    "data": {"kind": "fashion_mnist", "seq_len": 49, "path": "/nonexistent/fashion"},
    "train": {"steps": 1, "micro_batch_size": 2}
  })");
  const CommandResult r =
      worker(config.string(), "--set train.out_dir=" + (dir / "run").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("/nonexistent/fashion"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;
}

TEST(Worker, CorruptTokenShardNamesTheMagicFound) {
  TempDir dir;
  std::vector<std::uint16_t> tokens(4096, 7);
  data::write_token_shard(dir / "train.bin", tokens);
  data::write_token_shard(dir / "val.bin", tokens);
  {  // Overwrite the magic of the training shard.
    std::FILE* f = std::fopen((dir / "train.bin").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    const std::int32_t bad = 12345;
    std::fwrite(&bad, sizeof bad, 1, f);
    std::fclose(f);
  }
  const auto config = dir.write("lm.json", fmt::format(R"({{
    "model": {{"kind": "lm", "vocab_size": 64, "d_model": 16, "n_heads": 2, "n_layers": 1,
              "max_seq_len": 16}},
    "data": {{"kind": "tokens", "seq_len": 16, "path": "{}", "val_path": "{}"}},
    "train": {{"steps": 1, "micro_batch_size": 2}}
  }})", (dir / "train.bin").string(), (dir / "val.bin").string()));
  const CommandResult r =
      worker(config.string(), "--set train.out_dir=" + (dir / "run").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("12345"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train.bin"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dtrain::testing

namespace dtrain::testing {
namespace {

// What a run says before its first step, and a line per saved checkpoint,
// with ISO timestamps on progress lines unless train.log_timestamps is off.
TEST(WorkerConsole, RunFactsCheckpointLinesAndTimestamps) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  const CommandResult r = worker(config.string(), "--set train.out_dir=" + (dir / "run").string() +
                                                      " --set checkpoint.every_steps=10 --set train.steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("M parameters | model state "));
  EXPECT_THAT(r.output, ::testing::HasSubstr("global batch 8 samples = 128 tokens (micro-batch 4 x accumulation 2 x 1 rank)"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("config " + (dir / "run" / "config.json").string()));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z step 10/10"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("checkpoint step 10 saved in .*: [0-9.]+ MB .*\\(sync\\)"));
  const CommandResult plain = worker(config.string(), "--set train.out_dir=" + (dir / "plain").string() +
                                                          " --set train.log_timestamps=false --set train.steps=5");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_THAT(plain.output, ::testing::HasSubstr("\nstep 5/5"));
}

// A finished run started again does nothing and writes nothing; --eval-only
// scores the checkpoint as the training run's eval line did; --print-config
// prints the resolved config.
TEST(WorkerConsole, FinishedRunEvalOnlyAndPrintConfig) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  const std::string run = " --set train.out_dir=" + (dir / "run").string() + " --set checkpoint.every_steps=30";
  ASSERT_EQ(worker(config.string(), run).exit_code, 0);
  const std::string metrics = read_file(dir / "run" / "metrics.jsonl");
  const CommandResult again = worker(config.string(), run);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, ::testing::HasSubstr("already finished at step 30"));
  EXPECT_EQ(read_file(dir / "run" / "metrics.jsonl"), metrics) << "a finished run's metrics changed";

  const CommandResult eval = worker(config.string(), run + " --eval-only");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const auto lines = read_jsonl(dir / "run" / "metrics.jsonl");
  const nlohmann::json& scored = lines.back();
  EXPECT_EQ(scored["event"], "eval");
  EXPECT_EQ(scored["step"], 30);
  nlohmann::json trained;
  for (const auto& j : lines) {
    if (j.value("event", "") == "eval" && j["step"] == 30 && trained.is_null()) trained = j;
  }
  ASSERT_FALSE(trained.is_null());
  EXPECT_EQ(scored["loss"], trained["loss"]) << "--eval-only scored the checkpoint differently";

  TempDir none;
  const CommandResult nothing = worker(config.string(), "--eval-only --set train.out_dir=" + (none / "r").string());
  EXPECT_EQ(nothing.exit_code, 2);
  EXPECT_THAT(nothing.output, ::testing::HasSubstr("checkpoint.resume"));

  const CommandResult printed = worker(config.string(), "--print-config --set train.steps=7");
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  const nlohmann::json resolved = nlohmann::json::parse(printed.output);
  EXPECT_EQ(resolved["train"]["steps"], 7);
  EXPECT_EQ(resolved["parallel"]["zero_stage"], 0);
  EXPECT_EQ(resolved["checkpoint"]["resume"], "auto");  // defaults filled in
}

}  // namespace
}  // namespace dtrain::testing
