// The tools after training, as the README's quick start uses them: a run
// that saved no checkpoint gets an error that says how to save one (from
// dtrain-generate and dtrain-ckpt export), and tools/onnx_run.py makes its
// input batch from the run's own data (--from-config) and says what it checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// A byte-level LM on a small text file of its own (data.kind text).
const char* kTextLm = R"({
  "model": {"kind": "lm", "vocab_size": 256, "d_model": 32, "n_heads": 2, "n_layers": 1,
            "d_ff": 64, "max_seq_len": 16},
  "data": {"kind": "text", "path": "TEXT", "seq_len": 16},
  "schedule": {"warmup_steps": 1},
  "train": {"steps": 4, "micro_batch_size": 4, "log_every": 2, "eval_batches": 1}
})";

// A patch classifier on Fashion-MNIST (installed by scripts/setup.sh).
const char* kFashion = R"({
  "model": {"kind": "classifier", "input": "patches", "patch_size": 7, "d_model": 32, "n_heads": 2,
            "n_layers": 1, "d_ff": 64, "max_seq_len": 16, "num_classes": 10},
  "data": {"kind": "fashion_mnist", "seq_len": 16},
  "schedule": {"warmup_steps": 1},
  "train": {"steps": 4, "micro_batch_size": 4, "log_every": 2, "eval_batches": 1}
})";

std::string text_lm(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += fmt::format("Fortune {} favours the prepared mind.\n", i);
  const auto data = dir.write("text.txt", text);
  std::string json = kTextLm;
  json.replace(json.find("TEXT"), 4, data.string());
  return json;
}

CommandResult train(const std::filesystem::path& config, const std::filesystem::path& out, const std::string& more) {
  return run_command(fmt::format("{}/dtrain-worker --config {} --set train.out_dir={} {}", bin_dir(), config.string(),
                                 out.string(), more));
}

CommandResult onnx_run(const std::string& args) {
  return run_command(fmt::format("{} {}/tools/onnx_run.py {}", venv_python(), source_dir(), args));
}

TEST(FirstHourTools, MissingCheckpointSaysHowToSaveOne) {
  TempDir dir;
  const auto config = dir.write("lm.json", text_lm(dir));
  ASSERT_EQ(train(config, dir / "run", "").exit_code, 0);
  const std::string folder = (dir / "run" / "checkpoints").string();

  const CommandResult generate =
      run_command(fmt::format("{}/dtrain-generate --checkpoint {} --prompt 'F'", bin_dir(), folder));
  EXPECT_EQ(generate.exit_code, 2) << generate.output;
  EXPECT_THAT(generate.output, HasSubstr("no checkpoint folder '" + folder + "'"));
  EXPECT_THAT(generate.output, HasSubstr("checkpoint.every_steps"));

  const CommandResult exported = run_command(fmt::format("{}/dtrain-ckpt export {} --format onnx --out {}", bin_dir(),
                                                         folder, (dir / "lm.onnx").string()));
  EXPECT_EQ(exported.exit_code, 2) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("checkpoint.every_steps"));
  EXPECT_THAT(exported.output, HasSubstr(folder));

  // An empty checkpoint folder says the same.
  std::filesystem::create_directories(folder);
  const CommandResult empty =
      run_command(fmt::format("{}/dtrain-generate --checkpoint {} --prompt 'F'", bin_dir(), folder));
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_THAT(empty.output, HasSubstr("no committed checkpoint step under"));
  EXPECT_THAT(empty.output, HasSubstr("checkpoint.every_steps"));
}

// Trains `json` with a checkpoint at its last step, exports it to ONNX and
// returns the run folder.
std::filesystem::path trained_and_exported(const TempDir& dir, const std::string& json) {
  const auto config = dir.write("config.json", json);
  const auto run = dir / "run";
  const CommandResult r = train(config, run, "--set checkpoint.every_steps=4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const CommandResult e = run_command(fmt::format("{}/dtrain-ckpt export {} --format onnx --out {}", bin_dir(),
                                                  (run / "checkpoints").string(), (dir / "model.onnx").string()));
  EXPECT_EQ(e.exit_code, 0) << e.output;
  return run;
}

// The batch onnx_run.py made is the one dtrain's own held-out loader reads:
// ONNX Runtime's loss on it equals dtrain's eval loss over the same rows
// (--eval-only with a micro-batch of `rows` and one eval batch), within
// 1e-4 (the two runtimes' float rounding; a wrong row or layout is off by far more).
void expect_loss_matches_dtrain_eval(const std::filesystem::path& run, const std::string& onnx_output, int rows) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(onnx_output, m, std::regex("loss on this batch: ([0-9.]+)"))) << onnx_output;
  const double onnx_loss = std::stod(m[1]);
  const CommandResult eval = run_command(fmt::format(
      "{}/dtrain-worker --config {} --eval-only --set train.micro_batch_size={} --set train.eval_batches=1", bin_dir(),
      (run / "config.json").string(), rows));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  std::istringstream lines(read_file(run / "metrics.jsonl"));
  std::string line, last;
  while (std::getline(lines, line)) last = line;
  const nlohmann::json scored = nlohmann::json::parse(last);
  ASSERT_EQ(scored["event"], "eval") << last;
  EXPECT_NEAR(onnx_loss, scored["loss"].get<double>(), 1e-4) << onnx_output << eval.output;
}

TEST(FirstHourTools, OnnxRunMakesTheBatchFromTheRunsTextData) {
  TempDir dir;
  const auto run = trained_and_exported(dir, text_lm(dir));
  const std::string model = (dir / "model.onnx").string();
  const CommandResult r =
      onnx_run(fmt::format("{} --check --from-config {} --batch 3", model, (run / "config.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("passes"));
  EXPECT_THAT(r.output, HasSubstr("input tokens: int64 [3, 16] from data.path '" + (dir / "text.txt").string() +
                                  "' (its last 10%, held out from training)"));
  EXPECT_THAT(r.output, HasSubstr("output logits: float32 [3, 16, 256], every value finite: yes"));
  EXPECT_THAT(r.output, ContainsRegex("accuracy on this batch: [0-9]+/48 next-byte predictions"));
  expect_loss_matches_dtrain_eval(run, r.output, 3);

  // --out-dir keeps the batch it made, which --input then takes as it is.
  const auto out = dir / "out";
  const CommandResult kept = onnx_run(fmt::format("{} --from-config {} --batch 3 --out-dir {}", model,
                                                  (run / "config.json").string(), out.string()));
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  const CommandResult again = onnx_run(
      fmt::format("{} --input tokens={} --out-dir {}", model, (out / "tokens.pb").string(), (dir / "again").string()));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(read_file(out / "logits.pb"), read_file(dir / "again" / "logits.pb"));
}

TEST(FirstHourTools, OnnxRunMakesTheBatchFromFashionMnist) {
  TempDir dir;
  const auto run = trained_and_exported(dir, kFashion);
  const CommandResult r = onnx_run(fmt::format("{} --from-config {} --batch 5", (dir / "model.onnx").string(),
                                               (run / "config.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("input patches: float32 [5, 16, 49] from '/usr/share/datasets/fashion-mnist' "
                                  "(t10k, the test split)"));
  EXPECT_THAT(r.output, HasSubstr("output logits: float32 [5, 10], every value finite: yes"));
  EXPECT_THAT(r.output, ContainsRegex("accuracy on this batch: [0-9]/5 labels"));
  expect_loss_matches_dtrain_eval(run, r.output, 5);

  const CommandResult synthetic = onnx_run(fmt::format("{} --from-config {}", (dir / "model.onnx").string(),
                                                       dir.write("s.json", R"({"data": {"kind": "synthetic"}})").string()));
  EXPECT_EQ(synthetic.exit_code, 2);
  EXPECT_THAT(synthetic.output, HasSubstr("--input NAME=FILE.pb"));
}

}  // namespace
}  // namespace dtrain::testing
