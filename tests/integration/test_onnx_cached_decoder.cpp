// dtrain-ckpt export --format onnx --with-past (the cached decoder) end to
// end, on checkpoints the real dtrain-worker wrote, in ONNX Runtime (through
// tools/onnx_run.py --greedy), for today's block (learned positions) and the
// LLaMA family's (RMSNorm, rotary positions, SwiGLU, 2 key/value heads for 4
// query heads):
//   - greedy decoding with the cache (the prompt once, then one token at a
//     time with present fed back as past) picks the same 16 tokens as
//     dtrain-generate --temperature 0 from the same checkpoint and prompt, for
//     both rows of a batch of 2;
//   - the logits of every position it ran equal the plain export's logits of
//     the whole sequence within 1e-4;
//   - --with-past with another format is refused, naming the option.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/onnx_testing.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

namespace ck = dtrain::checkpoint;
namespace fs = std::filesystem;

struct DecoderRun {
  const char* name;
  const char* json;
};

// max_seq_len 24 holds the prompt (5) and the 16 new tokens.
const std::vector<DecoderRun> kRuns = {
    {"default_block", R"({"model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
                                    "d_ff": 64, "max_seq_len": 24, "tie_embeddings": true},
                          "data": {"kind": "synthetic", "seq_len": 24}})"},
    {"llama", R"({"model": {"kind": "lm", "vocab_size": 50, "d_model": 32, "n_heads": 4, "n_kv_heads": 2,
                            "n_layers": 2, "d_ff": 40, "max_seq_len": 24, "norm": "rmsnorm", "norm_eps": 1e-6,
                            "position": "rope", "rope_theta": 500, "mlp": "swiglu", "bias": false},
                  "data": {"kind": "synthetic", "seq_len": 24}})"},
};

constexpr std::int64_t kBatch = 2, kPrompt = 5, kNew = 16;

// An int64 tensor written by onnx_run.py (numpy_helper.from_array: raw_data).
std::vector<std::int64_t> read_int64_tensor(const fs::path& file, std::vector<std::int64_t>* dims) {
  onnx::TensorProto t;
  std::ifstream in(file, std::ios::binary);
  if (!t.ParseFromIstream(&in)) throw Error("cannot parse the TensorProto " + file.string());
  if (t.data_type() != onnx::TensorProto::INT64) throw Error(file.string() + " is not an int64 tensor");
  dims->assign(t.dims().begin(), t.dims().end());
  std::vector<std::int64_t> v(t.raw_data().size() / sizeof(std::int64_t));
  std::memcpy(v.data(), t.raw_data().data(), v.size() * sizeof(std::int64_t));
  return v;
}

// dtrain-generate's greedy tokens (its native forward with its own cache) after `prompt`.
std::vector<std::int64_t> generate_greedy(const fs::path& root, const std::vector<std::int64_t>& prompt) {
  std::string ids;
  for (std::int64_t t : prompt) ids += fmt::format("{}{}", ids.empty() ? "" : " ", t);
  const CommandResult r = run_command(fmt::format("{}/dtrain-generate --checkpoint {} --prompt '{}' "
                                                  "--max-new-tokens {} --temperature 0",
                                                  bin_dir(), root.string(), ids, kNew));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string first;
  std::getline(lines, first);  // stdout's line of token ids comes before anything on stderr
  std::istringstream words(first);
  std::vector<std::int64_t> tokens;
  for (std::int64_t t = 0; words >> t;) tokens.push_back(t);
  return tokens;
}

TEST(OnnxCachedDecoder, GreedyDecodingWithTheCacheMatchesDtrainGenerateAndThePlainGraph) {
  require_onnx_runtime();
  TempDir dir;
  std::mt19937 rng(11);
  for (const DecoderRun& run : kRuns) {
    const fs::path root = train_checkpoint(dir, run.name, run.json);
    const fs::path plain = dir / (std::string(run.name) + ".onnx");
    const fs::path cached = dir / (std::string(run.name) + ".with_past.onnx");
    ASSERT_EQ(ckpt(fmt::format("export {} --format onnx --out {}", root.string(), plain.string())).exit_code, 0);
    const CommandResult exported =
        ckpt(fmt::format("export {} --format onnx --with-past --out {}", root.string(), cached.string()));
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    const onnx::ModelProto model = read_onnx(cached);
    const ck::Manifest manifest = ck::read_manifest(*ck::default_env(), ck::step_dir(root, 5));
    const nn::ModelConfig c = worker::model_config(worker::parse_config_json(manifest.config_json()));
    // tokens + (key, value) per layer in; logits + (key, value) per layer out.
    ASSERT_EQ(model.graph().input_size(), 1 + 2 * c.n_layers);
    ASSERT_EQ(model.graph().output_size(), 1 + 2 * c.n_layers);
    EXPECT_EQ(model.graph().input(1).name(), "past_key_values.0.key");
    EXPECT_EQ(model.graph().output(2 * c.n_layers).name(), fmt::format("present.{}.value", c.n_layers - 1));
    const auto& past_shape = model.graph().input(1).type().tensor_type().shape();
    ASSERT_EQ(past_shape.dim_size(), 4);
    EXPECT_EQ(past_shape.dim(1).dim_value(), c.kv_heads());
    EXPECT_EQ(past_shape.dim(3).dim_value(), c.head_dim());

    std::uniform_int_distribution<std::int64_t> token(0, c.vocab_size - 1);
    std::vector<std::int64_t> prompt(static_cast<std::size_t>(kBatch * kPrompt));
    for (auto& t : prompt) t = token(rng);
    const fs::path work = dir / (std::string(run.name) + "_greedy");
    fs::create_directories(work);
    write_tensor(work / "prompt.pb", "tokens", {kBatch, kPrompt}, prompt);
    const std::string command =
        fmt::format("{} {}/tools/onnx_run.py {} --check --greedy {} --input tokens={} --out-dir {}", venv_python(),
                    source_dir(), cached.string(), kNew, (work / "prompt.pb").string(), (work / "out").string());
    const CommandResult greedy = run_command(command);
    ASSERT_EQ(greedy.exit_code, 0) << command << "\n" << greedy.output;
    std::vector<std::int64_t> token_dims, logit_dims;
    const std::vector<std::int64_t> tokens = read_int64_tensor(work / "out" / "tokens.pb", &token_dims);
    const std::vector<float> logits = read_float_tensor(work / "out" / "logits.pb", &logit_dims);
    const std::int64_t total = kPrompt + kNew - 1;  // the positions the cached runs computed
    ASSERT_EQ(token_dims, (std::vector<std::int64_t>{kBatch, kNew}));
    ASSERT_EQ(logit_dims, (std::vector<std::int64_t>{kBatch, total, c.vocab_size}));

    // Token for token against dtrain-generate, row by row; the whole sequence for the plain graph.
    std::vector<std::int64_t> sequence;
    for (std::int64_t b = 0; b < kBatch; ++b) {
      const auto row_prompt = prompt.begin() + b * kPrompt;
      const auto row_new = tokens.begin() + b * kNew;
      const std::vector<std::int64_t> onnx_new(row_new, row_new + kNew);
      EXPECT_EQ(onnx_new, generate_greedy(root, std::vector<std::int64_t>(row_prompt, row_prompt + kPrompt)))
          << run.name << " row " << b;
      sequence.insert(sequence.end(), row_prompt, row_prompt + kPrompt);
      sequence.insert(sequence.end(), row_new, row_new + kNew - 1);
    }
    const fs::path sets = dir / (std::string(run.name) + "_plain");
    fs::create_directories(data_set(sets, 0));
    write_tensor(data_set(sets, 0) / "input_0.pb", "tokens", {kBatch, total}, sequence);
    run_onnx_data_sets(plain, sets);
    std::vector<std::int64_t> plain_dims;
    const std::vector<float> whole = read_float_tensor(data_set(sets, 0) / "ort_output_0.pb", &plain_dims);
    ASSERT_EQ(plain_dims, logit_dims);
    double worst = 0.0, scale = 0.0;
    for (std::size_t j = 0; j < whole.size(); ++j) {
      worst = std::max(worst, std::fabs(static_cast<double>(logits[j]) - whole[j]));
      scale = std::max(scale, std::fabs(static_cast<double>(whole[j])));
    }
    EXPECT_LE(worst, 1e-4) << run.name << ": largest |logit| " << scale;
    std::cout << fmt::format("{}: {} new tokens equal dtrain-generate's; max |cached - plain| logit = {:.2e} "
                             "(largest |logit| {:.2f})\n",
                             run.name, kBatch * kNew, worst, scale);
  }
}

TEST(OnnxCachedDecoder, WithPastIsForOnnxOnly) {
  TempDir dir;
  const fs::path root = train_checkpoint(dir, "lm", kRuns[0].json);
  const CommandResult r =
      ckpt(fmt::format("export {} --format triton --with-past --out {}", root.string(), (dir / "repo").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'--with-past': the cached decoder is an ONNX graph: use it with --format onnx"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "repo"));
}

}  // namespace
}  // namespace dtrain::testing
