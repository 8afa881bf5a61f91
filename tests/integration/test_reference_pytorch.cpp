// The decoder block against an independent PyTorch implementation
// (tests/programs/reference_lm.py, written from the published GPT-2 and LLaMA
// definitions; Debian's python3-torch): dtrain-worker trains 20 steps in f32
// without dropout, the reference trains the same 20 steps from the same
// initial parameters on the same token windows with torch.optim.AdamW, and
// every step's loss agrees within 1e-5 relative.
//
// The initial parameters are what every rank's engine starts from: the
// layout's init at train.seed (nn::init_parameter depends on the seed and the
// parameter's index only), written here in dtrain-ckpt export's safetensors
// form (dtrain's names and shapes). The run's last step, exported by
// dtrain-ckpt, goes to the reference as well: it checks the names and shapes
// against its own reading of the layout and reports how far its final
// parameters are from dtrain's.
//
// The block options of the LLaMA family (model.norm, position, mlp,
// n_kv_heads, bias) are cases too: while the worker refuses them as unknown
// config fields, those cases skip, saying so; any other refusal fails.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/token_shard.h"
#include "export/safetensors.h"
#include "nn/parameters.h"
#include "nn/transformer.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::testing {
namespace {

constexpr int kSteps = 20;
constexpr double kLossTolerance = 1e-5;  // relative, per step
constexpr double kLr = 3e-3;
// The final parameters, absolute: a third of one step's largest AdamW update
// (lr), so one update of a wrong sign or size anywhere fails (measured on
// today's block: under 1e-4).
constexpr double kParameterTolerance = kLr / 3;
constexpr int kVocab = 96;
constexpr int kSeqLen = 16;

// A block: the model fields it adds to today's config (JSON members), and
// whether the head shares the token embedding.
struct BlockCase {
  std::string name;
  std::string model_fields;
  bool tied;
};

// Test names and ctest's listing show the case's name, not its bytes.
void PrintTo(const BlockCase& c, std::ostream* os) { *os << c.name; }

// The LLaMA-family block (RMSNorm, rotary positions, SwiGLU, no biases) with
// `kv_heads` key/value heads for the 4 query heads.
BlockCase llama(const std::string& name, int kv_heads, bool tied) {
  return {name,
          fmt::format(R"("norm": "rmsnorm", "position": "rope", "mlp": "swiglu", "bias": false, "n_kv_heads": {}, )",
                      kv_heads),
          tied};
}

std::string config_json(const BlockCase& c, const TempDir& dir) {
  return fmt::format(R"({{
  "model": {{"kind": "lm", "vocab_size": {}, "d_model": 48, "n_heads": 4, "n_layers": 2, "d_ff": 128,
            "max_seq_len": {}, "dropout": 0, {}"tie_embeddings": {}}},
  "data": {{"kind": "tokens", "path": "{}", "val_path": "{}", "seq_len": {}, "shuffle": false}},
  "optimizer": {{"lr": {}, "weight_decay": 0.1, "grad_clip": 1.0}},
  "schedule": {{"warmup_steps": 0, "decay": "constant"}},
  "train": {{"steps": {}, "micro_batch_size": 4, "grad_accum_steps": 1, "log_every": 1, "eval_batches": 1,
            "log_timestamps": false, "tensorboard_dir": ""}},
  "checkpoint": {{"dir": "{}", "every_steps": {}}},
  "precision": "fp32"
}})",
                     kVocab, kSeqLen, c.model_fields, c.tied ? "true" : "false", dir.file("train.bin"),
                     dir.file("val.bin"), kSeqLen, kLr, kSteps, dir.file("ckpt"), kSteps);
}

// A stream with something to learn: mostly a fixed successor rule, a quarter
// of the tokens random.
std::vector<std::uint16_t> token_stream(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> tokens(n);
  tokens[0] = 1;
  for (std::size_t i = 1; i < n; ++i) {
    const std::uint32_t r = rng();
    tokens[i] = static_cast<std::uint16_t>(r % 4 == 0 ? (r >> 8) % kVocab : (7 * tokens[i - 1] + 3) % kVocab);
  }
  return tokens;
}

// The parameters of `layout` at train.seed, as dtrain-ckpt export writes a
// step: safetensors, F32, layout order.
void write_initial_parameters(const nn::ParameterLayout& layout, std::uint64_t seed, const std::string& path) {
  nn::ParameterStore store(layout, seed);
  std::ofstream out(path, std::ios::binary);
  exporter::write_safetensors(
      layout, {{"format", "pt"}, {"step", "0"}},
      [&](int b, std::span<float> block) {
        const float* data = store.params().data() + layout.block_offset(b);
        std::copy(data, data + block.size(), block.begin());
      },
      [&](const void* data, std::size_t n) { out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n)); });
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// Fails the test (from a TEST body) when Debian's python3 has no PyTorch:
// scripts/setup.sh installs it, so its absence is a broken setup, not a
// machine that cannot run the test.
#define REQUIRE_TORCH()                                                                                      \
  do {                                                                                                       \
    const CommandResult torch = run_command("timeout -s KILL 60 /usr/bin/python3 -c 'import numpy, torch'"); \
    ASSERT_EQ(torch.exit_code, 0) << "Debian's /usr/bin/python3 cannot import torch and numpy: run "         \
                                     "scripts/setup.sh (it installs python3-torch): "                        \
                                  << torch.output;                                                           \
  } while (false)

std::string reference_script() { return source_dir() + "/tests/programs/reference_lm.py"; }

// The reference's LLaMA pieces against closed forms (rotary: relative
// positions and the rotate-half pairs; grouped-query attention: multi-head
// attention with copied key/value heads; causality; RMSNorm, SwiGLU and the
// tanh GELU by their formulas), so the LLaMA cases stand on a checked reference
// before dtrain has the block.
TEST(ReferencePytorchSelfCheck, PiecesMatchTheirClosedForms) {
  REQUIRE_TORCH();
  const CommandResult r = run_command("timeout -s KILL 120 /usr/bin/python3 " + reference_script() + " --self-check");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(R"("ok": true)"), std::string::npos) << r.output;
}

class ReferencePytorch : public ::testing::TestWithParam<BlockCase> {};

TEST_P(ReferencePytorch, LossesMatchOverTwentySteps) {
  REQUIRE_TORCH();
  const BlockCase& c = GetParam();

  TempDir dir;
  data::write_token_shard(dir.file("train.bin"), token_stream(4097, 1));
  data::write_token_shard(dir.file("val.bin"), token_stream(1025, 2));
  const auto config = dir.write("block.json", config_json(c, dir));
  const std::string out_dir = dir.file("run");
  const CommandResult run =
      run_command(fmt::format("timeout -s KILL 300 {}/dtrain-worker --config {} --set train.out_dir={}", bin_dir(),
                              config.string(), out_dir));
  ASSERT_EQ(run.exit_code, 0) << run.output;

  const config::Config resolved = worker::load_config(config, {"train.out_dir=" + out_dir});
  const nn::ParameterLayout layout = nn::declare_parameters(worker::model_config(resolved));
  write_initial_parameters(layout, resolved.train().seed(), dir.file("init.safetensors"));
  const CommandResult exported =
      run_command(fmt::format("timeout -s KILL 120 {}/dtrain-ckpt export {} --format safetensors --out {}", bin_dir(),
                              dir.file("ckpt"), dir.file("final.safetensors")));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;

  const CommandResult reference = run_command(fmt::format(
      "timeout -s KILL 300 /usr/bin/python3 {} --config {}/config.json --init {} --final {} > {}", reference_script(),
      out_dir, dir.file("init.safetensors"), dir.file("final.safetensors"),
      dir.file("reference.jsonl")));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;

  // The reference's steps, and its comparison of the final parameters.
  std::vector<nlohmann::json> theirs;
  nlohmann::json final_line;
  for (auto& j : json_lines(read_file(dir / "reference.jsonl"))) {
    if (j.contains("event")) {
      final_line = std::move(j);
    } else {
      theirs.push_back(std::move(j));
    }
  }
  std::vector<nlohmann::json> ours;
  for (auto& j : json_lines(read_file(dir / "run" / "metrics.jsonl"))) {
    if (!j.contains("event")) ours.push_back(std::move(j));
  }
  ASSERT_EQ(ours.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(theirs.size(), static_cast<std::size_t>(kSteps));
  const auto relative = [](double a, double b) { return std::abs(a - b) / std::abs(b); };
  double worst = 0.0, worst_norm = 0.0;
  for (std::size_t s = 0; s < ours.size(); ++s) {
    const double loss = ours[s]["loss"].get<double>(), reference_loss = theirs[s]["loss"].get<double>();
    worst = std::max(worst, relative(loss, reference_loss));
    worst_norm =
        std::max(worst_norm, relative(ours[s]["grad_norm"].get<double>(), theirs[s]["grad_norm"].get<double>()));
    EXPECT_LE(relative(loss, reference_loss), kLossTolerance)
        << c.name << " step " << s + 1 << ": dtrain " << loss << ", PyTorch " << reference_loss;
  }
  // The comparison covers real training: the loss moved.
  EXPECT_LT(ours.back()["loss"].get<double>(), ours.front()["loss"].get<double>() - 0.1)
      << "the loss hardly moved in " << kSteps << " steps";
  ASSERT_FALSE(final_line.is_null()) << "the reference printed no comparison of the final parameters";
  const double final_diff = final_line["max_abs_diff"].get<double>();
  std::cout << fmt::format("{}: loss {:.4f} -> {:.4f}; max relative difference: loss {:.3g}, grad_norm {:.3g}; "
                           "final parameters: max abs difference {:.3g} ({})\n",
                           c.name, ours.front()["loss"].get<double>(), ours.back()["loss"].get<double>(), worst,
                           worst_norm, final_diff, final_line["tensor"].get<std::string>());
  EXPECT_LE(final_diff, kParameterTolerance)
      << c.name << ": after " << kSteps << " steps " << final_line["tensor"].get<std::string>()
      << " differs from the reference's by " << final_diff;
  RecordProperty("max_relative_loss_difference", fmt::format("{:.3g}", worst));
}

const BlockCase kCases[] = {
    {"Gpt2Untied", "", false},
    {"Gpt2Tied", "", true},
    llama("LlamaMhaUntied", 4, false),
    llama("LlamaMhaTied", 4, true),
    llama("LlamaGqaUntied", 2, false),
    llama("LlamaGqaTied", 2, true),
    llama("LlamaMqaUntied", 1, false),
    llama("LlamaMqaTied", 1, true),
    {"Gpt2TanhGeluTied", R"("mlp": "gelu_tanh", )", true},
};

INSTANTIATE_TEST_SUITE_P(Blocks, ReferencePytorch, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<BlockCase>& info) { return info.param.name; });

}  // namespace
}  // namespace dtrain::testing
