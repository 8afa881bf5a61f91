// dtrain-generate end to end: a byte-level LM trained in the test to
// overfit one repeated sentence reproduces it from a prompt when decoding
// greedily; the key/value cache and a full recompute of the prefix pick the
// same tokens; the same seed gives the same sampled text; bad input (an empty
// checkpoint folder, a classifier, a prompt longer than model.max_seq_len, a
// negative temperature, a token model given text) is an error naming it.
// (tests/unit/test_transformer.cpp checks the cache's logits against a full
// recompute within 1e-5 at every position.)
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "tools/generate.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

const std::string kSentence = "the cat sat on the mat. ";

// Trains `config_json` (with out_dir and checkpoint dir set) and saves a checkpoint.
void train(const std::string& config_json, const std::filesystem::path& out, const std::filesystem::path& data) {
  std::vector<std::string> overrides = {"train.out_dir=" + out.string(),
                                        "checkpoint.dir=" + (out / "checkpoints").string()};
  if (!data.empty()) overrides.push_back("data.path=" + data.string());
  const config::Config config = worker::parse_config_json(config_json, overrides);
  worker::Trainer trainer(config, {.write_outputs = false, .console = nullptr, .comm = nullptr});
  trainer.run();
  trainer.save_checkpoint();
}

CommandResult generate(const std::string& args) { return run_command(bin_dir() + "/dtrain-generate " + args); }

class DtrainGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::filesystem::path text = dir_->path() / "sentence.txt";
    std::ofstream out(text);
    for (int i = 0; i < 200; ++i) out << kSentence;
    out.close();
    train(R"({
      "model": {"kind": "lm", "vocab_size": 256, "d_model": 48, "n_heads": 2, "n_layers": 2,
                "d_ff": 96, "max_seq_len": 48},
      "data": {"kind": "text", "seq_len": 48},
      "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
      "schedule": {"warmup_steps": 10, "decay": "constant"},
      "train": {"steps": 150, "micro_batch_size": 8, "log_every": 50, "eval_every": 0}
    })", dir_->path() / "lm", text);
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string lm() { return (dir_->path() / "lm" / "checkpoints").string(); }
  static TempDir* dir_;
};

TempDir* DtrainGenerate::dir_ = nullptr;

TEST_F(DtrainGenerate, GreedyDecodingReproducesTheSentenceItLearned) {
  const CommandResult r =
      generate("--checkpoint " + lm() + " --prompt 'the cat' --temperature 0 --max-new-tokens 40");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the cat sat on the mat. the cat sat on the"));
}

TEST_F(DtrainGenerate, TheCacheAndAFullRecomputePickTheSameTokens) {
  tools::GenerateOptions o{.checkpoint = lm(), .prompt = "the ", .max_new_tokens = 30, .temperature = 0.0};
  const tools::Generated cached = tools::generate(o);
  o.recompute = true;
  EXPECT_EQ(tools::generate(o).tokens, cached.tokens);
  EXPECT_EQ(cached.tokens.size(), 30u);
}

TEST_F(DtrainGenerate, TheSameSeedGivesTheSameText) {
  const std::string args = "--checkpoint " + lm() + " --prompt 'the' --temperature 1.5 --max-new-tokens 30";
  const CommandResult a = generate(args + " --seed 7"), b = generate(args + " --seed 7");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(generate(args + " --seed 8").output, a.output) << "a seed that changes nothing";
}

TEST_F(DtrainGenerate, BadInputIsAnErrorNamingIt) {
  TempDir empty;
  CommandResult r = generate("--checkpoint " + empty.str());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("no committed checkpoint step under"));
  r = generate("--checkpoint " + lm() + " --prompt '" + std::string(49, 'x') + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("model.max_seq_len = 48"));
  r = generate("--checkpoint " + lm() + " --temperature -1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--temperature"));

  TempDir cls;
  train(R"({
    "model": {"kind": "classifier", "vocab_size": 16, "d_model": 16, "n_heads": 2, "n_layers": 1,
              "d_ff": 32, "max_seq_len": 8, "num_classes": 4},
    "data": {"kind": "synthetic", "seq_len": 8},
    "train": {"steps": 1, "micro_batch_size": 2, "eval_every": 0}
  })", cls.path(), {});
  r = generate("--checkpoint " + (cls.path() / "checkpoints").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("holds a classifier model"));

  TempDir tokens;
  train(R"({
    "model": {"kind": "lm", "vocab_size": 32, "d_model": 16, "n_heads": 2, "n_layers": 1,
              "d_ff": 32, "max_seq_len": 8},
    "data": {"kind": "synthetic", "seq_len": 8},
    "train": {"steps": 1, "micro_batch_size": 2, "eval_every": 0}
  })", tokens.path(), {});
  const std::string token_lm = (tokens.path() / "checkpoints").string();
  r = generate("--checkpoint " + token_lm + " --prompt 'hello'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("not a token id of this model (0 .. 31)"));
  r = generate("--checkpoint " + token_lm + " --prompt '1 2 3' --max-new-tokens 4 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::MatchesRegex("^[0-9]+ [0-9]+ [0-9]+ [0-9]+\n$"));  // token models print ids
}

}  // namespace
}  // namespace dtrain::testing
