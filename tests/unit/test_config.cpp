#include "worker/config.h"

#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "worker/trainer.h"

namespace dtrain::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kMinimalLm = R"({
  "model": {"kind": "lm", "vocab_size": 256, "d_model": 64, "n_heads": 4, "n_layers": 2},
  "data": {"kind": "text", "path": "corpus.txt", "seq_len": 32},
  "train": {"steps": 100, "micro_batch_size": 8}
})";

constexpr const char* kMinimalClassifier = R"({
  "model": {"kind": "classifier", "input": "patches", "patch_size": 4, "num_classes": 10,
            "d_model": 32, "n_heads": 2, "n_layers": 1},
  "data": {"kind": "fashion_mnist", "seq_len": 49},
  "train": {"steps": 10, "micro_batch_size": 16}
})";

// Runs `fn`, which must throw ConfigError, and returns the error.
template <typename Fn>
ConfigError config_error(Fn fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConfigError";
  return ConfigError("", "");
}

ConfigError lm_error(const std::vector<std::string>& overrides) {
  return config_error([&] { parse_config_json(kMinimalLm, overrides); });
}

ConfigError json_error(const std::string& json) {
  return config_error([&] { parse_config_json(json); });
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / fmt::format("dtrain_config_{}", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

bool equal(const config::Config& a, const config::Config& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

TEST(Config, MinimalLmResolvesWithDocumentedDefaults) {
  const config::Config c = parse_config_json(kMinimalLm);
  EXPECT_EQ(c.model().d_ff(), 4 * 64);
  EXPECT_EQ(c.model().max_seq_len(), 32);
  EXPECT_EQ(c.model().input(), "tokens");
  EXPECT_TRUE(c.data().shuffle());
  EXPECT_EQ(c.data().prefetch(), 4);
  EXPECT_EQ(c.optimizer().lr(), 3e-4f);
  EXPECT_EQ(c.optimizer().beta1(), 0.9f);
  EXPECT_EQ(c.optimizer().beta2(), 0.999f);
  EXPECT_EQ(c.optimizer().eps(), 1e-8f);
  EXPECT_EQ(c.optimizer().weight_decay(), 0.01f);
  EXPECT_EQ(c.optimizer().grad_clip(), 1.0f);
  EXPECT_EQ(c.schedule().decay(), "cosine");
  EXPECT_EQ(c.schedule().min_lr_ratio(), 0.1f);
  EXPECT_EQ(c.train().grad_accum_steps(), 1);
  EXPECT_EQ(c.train().seed(), 1337u);
  EXPECT_EQ(c.train().log_every(), 10);
  EXPECT_EQ(c.train().eval_batches(), 20);
  EXPECT_EQ(c.train().out_dir(), "runs/default");
  EXPECT_EQ(c.parallel().backend(), "auto");
  EXPECT_EQ(c.parallel().bucket_mb(), 25.0f);
  EXPECT_EQ(c.parallel().first_bucket_mb(), 1.0f);
  EXPECT_EQ(c.parallel().zero3_max_live_mb(), 4000.0f);
  EXPECT_EQ(c.parallel().timeout_s(), 300);
  EXPECT_EQ(c.checkpoint().keep_last(), 3);
  EXPECT_EQ(c.checkpoint().resume(), "auto");
  EXPECT_EQ(c.precision(), "fp32");
  EXPECT_EQ(c.device(), "cpu");
  // Today's block unless the config says otherwise.
  EXPECT_EQ(c.model().norm(), "layernorm");
  EXPECT_EQ(c.model().norm_eps(), 1e-5f);
  EXPECT_EQ(c.model().position(), "learned");
  EXPECT_EQ(c.model().rope_theta(), 10000.0f);
  EXPECT_EQ(c.model().mlp(), "gelu");
  EXPECT_EQ(c.model().n_kv_heads(), 4);
  EXPECT_TRUE(c.model().bias());
  EXPECT_EQ(c.model().recompute(), "none");
}

TEST(Config, LlamaFamilyBlockResolves) {
  const config::Config c = parse_config_json(kMinimalLm, {"model.norm=rmsnorm", "model.position=rope",
                                                          "model.mlp=swiglu", "model.n_kv_heads=2",
                                                          "model.bias=false", "model.recompute=full"});
  const nn::ModelConfig m = worker::model_config(c);
  EXPECT_EQ(m.norm, nn::ModelConfig::Norm::rmsnorm);
  EXPECT_EQ(m.position, nn::ModelConfig::Position::rope);
  EXPECT_EQ(m.mlp, nn::ModelConfig::Mlp::swiglu);
  EXPECT_EQ(m.kv_heads(), 2);
  EXPECT_FALSE(m.bias);
  EXPECT_EQ(m.recompute, nn::ModelConfig::Recompute::full);
  EXPECT_EQ(m.rope_theta, 10000.0);
}

// Each bad block option: one ConfigError naming the field and what is allowed.
TEST(Config, BadBlockOptionsNameTheFieldAndTheAllowedValues) {
  ConfigError e = lm_error({"model.n_kv_heads=3"});
  EXPECT_EQ(e.field(), "model.n_kv_heads");
  EXPECT_THAT(e.what(), AllOf(HasSubstr("3 key/value heads do not divide model.n_heads (4)"), HasSubstr("divisor")));
  e = lm_error({"model.d_model=12", "model.position=rope"});
  EXPECT_EQ(e.field(), "model.position");
  EXPECT_THAT(e.what(), HasSubstr("head size d_model / n_heads = 3 is odd"));
  e = lm_error({"model.position=rope", "model.rope_theta=0"});
  EXPECT_EQ(e.field(), "model.rope_theta");
  EXPECT_THAT(e.what(), HasSubstr("must be > 0"));
  e = lm_error({"model.mlp=swiglu", "model.d_ff=-1"});
  EXPECT_EQ(e.field(), "model.d_ff");
  e = lm_error({"model.norm_eps=0"});
  EXPECT_EQ(e.field(), "model.norm_eps");
  const std::pair<const char*, const char*> unknown[] = {
      {"model.norm=batchnorm", "must be one of \"layernorm\", \"rmsnorm\""},
      {"model.position=alibi", "must be one of \"learned\", \"rope\""},
      {"model.mlp=relu", "must be one of \"gelu\", \"gelu_tanh\", \"swiglu\""},
      {"model.recompute=some", "must be one of \"none\", \"selective\", \"full\""}};
  for (const auto& [override_, message] : unknown) {
    e = lm_error({override_});
    EXPECT_EQ(e.field(), std::string(override_).substr(0, std::string(override_).find('='))) << override_;
    EXPECT_THAT(e.what(), HasSubstr(message)) << override_;
  }
}

TEST(Config, MinimalClassifierResolvesWithDatasetPath) {
  const config::Config c = parse_config_json(kMinimalClassifier);
  EXPECT_EQ(c.model().kind(), "classifier");
  EXPECT_EQ(c.model().d_ff(), 128);
  EXPECT_EQ(c.model().max_seq_len(), 49);
  EXPECT_EQ(c.data().path(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(c.optimizer().lr(), 3e-4f);
}

TEST(Config, ExplicitValuesAreNotReplacedByDefaults) {
  const config::Config c = parse_config_json(
      kMinimalLm, {"optimizer.weight_decay=0", "optimizer.grad_clip=0", "data.shuffle=false",
                   "model.d_ff=100", "train.out_dir=elsewhere"});
  EXPECT_TRUE(c.optimizer().has_weight_decay());
  EXPECT_EQ(c.optimizer().weight_decay(), 0.0f);
  EXPECT_EQ(c.optimizer().grad_clip(), 0.0f);
  EXPECT_FALSE(c.data().shuffle());
  EXPECT_EQ(c.model().d_ff(), 100);
  EXPECT_EQ(c.train().out_dir(), "elsewhere");
}

TEST(Config, LoadConfigNamesOutDirAfterTheFile) {
  const auto dir = fresh_dir("stem");
  write_file(dir / "tiny_lm.json", kMinimalLm);
  EXPECT_EQ(load_config(dir / "tiny_lm.json", {}).train().out_dir(), "runs/tiny_lm");
}

TEST(Config, MissingFileIsIoErrorNamingIt) {
  const auto path = fresh_dir("missing") / "nope.json";
  try {
    load_config(path, {});
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
  }
}

TEST(Config, UnknownTopLevelFieldListsSections) {
  const ConfigError e = json_error(R"({"modle": {}})");
  EXPECT_EQ(e.field(), "modle");
  EXPECT_THAT(e.what(), HasSubstr("valid fields of the config: model, data, optimizer"));
}

TEST(Config, UnknownNestedFieldNamesDottedPath) {
  const ConfigError e = json_error(R"({"model": {"kind": "lm", "d_modle": 64}})");
  EXPECT_EQ(e.field(), "model.d_modle");
  EXPECT_THAT(e.what(), AllOf(HasSubstr("did you mean d_model?"),
                              HasSubstr("valid fields of model: kind, vocab_size, d_model")));
}

TEST(Config, WrongTypeNamesFieldAndExpectedType) {
  ConfigError e = json_error(R"({"train": {"steps": "100"}})");
  EXPECT_EQ(e.field(), "train.steps");
  EXPECT_THAT(e.what(), AllOf(HasSubstr("expected an integer"), HasSubstr("string")));

  e = json_error(R"({"data": {"shuffle": 1}})");
  EXPECT_EQ(e.field(), "data.shuffle");
  EXPECT_THAT(e.what(), HasSubstr("expected true or false"));

  e = json_error(R"({"optimizer": {"lr": "fast"}})");
  EXPECT_EQ(e.field(), "optimizer.lr");
  EXPECT_THAT(e.what(), HasSubstr("expected a number"));

  e = json_error(R"({"model": [1, 2]})");
  EXPECT_EQ(e.field(), "model");
  EXPECT_THAT(e.what(), HasSubstr("expected an object"));

  e = json_error(R"({"train": {"seed": -1}})");
  EXPECT_EQ(e.field(), "train.seed");
}

TEST(Config, IntegersMustBeIntegralAndInRange) {
  EXPECT_EQ(lm_error({"train.steps=1.5"}).field(), "train.steps");
  EXPECT_THAT(lm_error({"train.steps=3000000000"}).what(), HasSubstr("out of range"));
  EXPECT_EQ(parse_config_json(kMinimalLm, {"train.steps=1e3"}).train().steps(), 1000);
}

TEST(Config, DModelNotDivisibleByHeadsNamesBoth) {
  const ConfigError e = lm_error({"model.d_model=256", "model.n_heads=3"});
  EXPECT_EQ(e.field(), "model.d_model");
  EXPECT_THAT(e.what(), HasSubstr("model.d_model (256) must be divisible by model.n_heads (3)"));
}

TEST(Config, SeqLenAboveMaxSeqLenIsAnError) {
  const ConfigError e = lm_error({"model.max_seq_len=16"});
  EXPECT_EQ(e.field(), "data.seq_len");
  EXPECT_THAT(e.what(), AllOf(HasSubstr("(32)"), HasSubstr("model.max_seq_len (16)")));
}

TEST(Config, OverridesAreParsedByFieldType) {
  const config::Config c = parse_config_json(
      kMinimalLm, {"train.steps=5", "optimizer.lr=1e-3", "data.shuffle=false",
                   "train.seed=18446744073709551615", "checkpoint.resume=auto"});
  EXPECT_EQ(c.train().steps(), 5);
  EXPECT_EQ(c.optimizer().lr(), 1e-3f);
  EXPECT_FALSE(c.data().shuffle());
  EXPECT_EQ(c.train().seed(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(c.checkpoint().resume(), "auto");
}

TEST(Config, StringOverrideMayBeBareOrQuoted) {
  const std::string classifier_as_lm = R"({
    "model": {"kind": "classifier", "num_classes": 2, "vocab_size": 256, "d_model": 64,
              "n_heads": 4, "n_layers": 2},
    "data": {"kind": "text", "path": "corpus.txt", "seq_len": 32},
    "train": {"steps": 100, "micro_batch_size": 8}
  })";
  EXPECT_EQ(parse_config_json(classifier_as_lm, {R"(model.kind="lm")"}).model().kind(), "lm");
  EXPECT_EQ(parse_config_json(classifier_as_lm, {"model.kind=lm"}).model().kind(), "lm");
}

TEST(Config, LaterOverrideWinsAndNullRestoresDefault) {
  const config::Config c =
      parse_config_json(kMinimalLm, {"optimizer.lr=0.5", "optimizer.lr=null", "train.steps=7",
                                     "train.steps=9"});
  EXPECT_EQ(c.optimizer().lr(), 3e-4f);
  EXPECT_EQ(c.train().steps(), 9);
}

TEST(Config, BadOverridesNameTheOverride) {
  ConfigError e = lm_error({"model.d_modle=3"});
  EXPECT_EQ(e.field(), "model.d_modle");
  EXPECT_THAT(e.what(), AllOf(HasSubstr("--set model.d_modle=3"),
                              HasSubstr("valid fields of model: kind")));

  e = lm_error({"train.steps"});
  EXPECT_THAT(e.what(), AllOf(HasSubstr("train.steps"), HasSubstr("key.path=value")));

  e = lm_error({"model.kind.name=lm"});
  EXPECT_EQ(e.field(), "model.kind");
  EXPECT_THAT(e.what(), HasSubstr("not a section"));

  e = lm_error({"train.steps=many"});
  EXPECT_EQ(e.field(), "train.steps");
  EXPECT_THAT(e.what(), AllOf(HasSubstr("--set train.steps=many"), HasSubstr("an integer")));
}

TEST(Config, MalformedJsonNamesLineAndColumn) {
  const std::string text = "{\n  \"model\": {\n    \"kind\": \"lm\",\n  }\n}\n";
  EXPECT_THAT(json_error(text).what(), AllOf(HasSubstr("malformed JSON"), HasSubstr("line 4")));

  const auto dir = fresh_dir("malformed");
  write_file(dir / "broken.json", text);
  const ConfigError e = config_error([&] { load_config(dir / "broken.json", {}); });
  EXPECT_THAT(e.what(), AllOf(HasSubstr("broken.json"), HasSubstr("line 4, column 3")));
}

TEST(Config, DuplicateKeyIsAnError) {
  EXPECT_EQ(json_error(R"({"model": {"d_model": 1, "d_model": 2}})").field(), "model.d_model");
}

TEST(Config, CommentsAreAllowed) {
  const std::string text = std::string("// tiny\n") + kMinimalLm;
  EXPECT_EQ(parse_config_json(text).model().d_model(), 64);
}

// One override per rule; each must fail naming the field the user has to change.
struct Rule {
  std::vector<std::string> overrides;
  std::string field;
};

class ConfigRule : public ::testing::TestWithParam<Rule> {};

TEST_P(ConfigRule, FailsNamingTheField) {
  EXPECT_EQ(lm_error(GetParam().overrides).field(), GetParam().field);
}

INSTANTIATE_TEST_SUITE_P(
    Validation, ConfigRule,
    ::testing::Values(
        Rule{{"model.kind=cnn"}, "model.kind"}, Rule{{"model.vocab_size=0"}, "model.vocab_size"},
        Rule{{"model.n_layers=0"}, "model.n_layers"}, Rule{{"model.d_ff=-1"}, "model.d_ff"},
        Rule{{"model.input=patches"}, "model.input"}, Rule{{"model.input=pixels"}, "model.input"},
        Rule{{"model.dropout=1"}, "model.dropout"},
        Rule{{"model.kind=classifier", "model.num_classes=1"}, "model.num_classes"},
        Rule{{"model.kind=classifier", "model.num_classes=2", "model.tie_embeddings=true"},
             "model.tie_embeddings"},
        Rule{{"data.kind=images"}, "data.kind"}, Rule{{"data.path="}, "data.path"},
        Rule{{"model.vocab_size=255"}, "model.vocab_size"},
        Rule{{"data.kind=fashion_mnist"}, "model.input"}, Rule{{"data.seq_len=0"}, "data.seq_len"},
        Rule{{"optimizer.lr=0"}, "optimizer.lr"}, Rule{{"optimizer.beta1=-0.1"}, "optimizer.beta1"},
        Rule{{"optimizer.beta2=1"}, "optimizer.beta2"}, Rule{{"optimizer.eps=0"}, "optimizer.eps"},
        Rule{{"optimizer.weight_decay=-1"}, "optimizer.weight_decay"},
        Rule{{"optimizer.grad_clip=-1"}, "optimizer.grad_clip"},
        Rule{{"schedule.warmup_steps=101"}, "schedule.warmup_steps"},
        Rule{{"schedule.warmup_steps=-1"}, "schedule.warmup_steps"},
        Rule{{"schedule.decay=step"}, "schedule.decay"},
        Rule{{"schedule.min_lr_ratio=1.5"}, "schedule.min_lr_ratio"},
        Rule{{"train.steps=0"}, "train.steps"},
        Rule{{"train.micro_batch_size=0"}, "train.micro_batch_size"},
        Rule{{"train.grad_accum_steps=0"}, "train.grad_accum_steps"},
        Rule{{"train.log_every=0"}, "train.log_every"},
        Rule{{"train.eval_every=-1"}, "train.eval_every"},
        Rule{{"train.eval_batches=0"}, "train.eval_batches"},
        Rule{{"parallel.backend=tcp"}, "parallel.backend"},
        Rule{{"parallel.zero_stage=4"}, "parallel.zero_stage"},
        Rule{{"parallel.bucket_mb=0"}, "parallel.bucket_mb"},
        Rule{{"parallel.first_bucket_mb=-1"}, "parallel.first_bucket_mb"},
        Rule{{"parallel.zero3_max_live_mb=-1"}, "parallel.zero3_max_live_mb"},
        Rule{{"parallel.timeout_s=0"}, "parallel.timeout_s"},
        Rule{{"checkpoint.every_steps=-1"}, "checkpoint.every_steps"},
        Rule{{"checkpoint.keep_last=0"}, "checkpoint.keep_last"},
        Rule{{"precision=fp8"}, "precision"}, Rule{{"device=tpu"}, "device"}));

TEST(Config, FashionMnistNeedsTenClasses) {
  EXPECT_EQ(config_error([] { parse_config_json(kMinimalClassifier, {"model.num_classes=5"}); })
                .field(),
            "model.num_classes");
  EXPECT_EQ(config_error([] { parse_config_json(kMinimalClassifier, {"model.patch_size=0"}); })
                .field(),
            "model.patch_size");
}

TEST(Config, JsonRoundTripIsIdentical) {
  for (const char* base : {kMinimalLm, kMinimalClassifier}) {
    const config::Config c = parse_config_json(
        base, {"optimizer.lr=1.234e-4", "optimizer.beta1=0.1", "schedule.min_lr_ratio=0.3333333",
               "model.dropout=0.1", "train.seed=18446744073709551615", "data.val_path=v.bin",
               "checkpoint.async=true", "parallel.bucket_mb=0.5"});
    const std::string json = config_to_json(c);
    EXPECT_THAT(json, HasSubstr("\"lr\": 0.0001234"));  // shortest form, not the widened double
    EXPECT_TRUE(equal(parse_config_json(json), c)) << json;
  }
}

TEST(Config, RoundTripThroughFileKeepsOutDir) {
  const auto dir = fresh_dir("roundtrip");
  write_file(dir / "run.json", kMinimalLm);
  const config::Config c = load_config(dir / "run.json", {"schedule.warmup_steps=10"});
  write_file(dir / "config.json", config_to_json(c));
  EXPECT_TRUE(equal(load_config(dir / "config.json", {}), c));
}

TEST(Config, FloatFieldsRoundTripBitForBit) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(1, 0x7f7fffffu);  // positive finite floats
  config::Config base = parse_config_json(kMinimalLm);
  for (int i = 0; i < 2000; ++i) {
    config::Config c = base;
    c.mutable_optimizer()->set_weight_decay(std::bit_cast<float>(bits(rng)));
    const config::Config back = parse_config_json(config_to_json(c));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(back.optimizer().weight_decay()),
              std::bit_cast<std::uint32_t>(c.optimizer().weight_decay()));
  }
}

TEST(Config, UnsetOptionalFieldsPrintAsNull) {
  const std::string json = config_to_json(config::Config{});
  EXPECT_THAT(json, AllOf(HasSubstr("\"lr\": null"), HasSubstr("\"kind\": \"\""),
                          HasSubstr("\"seq_len\": 0")));
}

}  // namespace
}  // namespace dtrain::worker
