// dtrain-bench train end to end on tiny models: the figures scripts read, and
// --profile's kernel table, whose call counts follow from the model's shape.
#include <map>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "support/run_command.h"

namespace dtrain {
namespace {

using testing::bin_dir;
using testing::run_command;
using ::testing::HasSubstr;
using ::testing::Not;

// A model of n_layers small enough for a test: 2 timed steps after 1 warm-up.
testing::CommandResult bench(const std::string& config, int n_layers, const std::string& flags) {
  return run_command(fmt::format(
      "OMP_NUM_THREADS=1 {}/dtrain-bench train --config {}/examples/configs/{}.json --steps 2 --warmup 1 "
      "--peak-seconds 0.01 {} --set model.n_layers={} model.d_model=64 model.n_heads=4 model.d_ff=128 "
      "data.seq_len=16 model.max_seq_len=16 train.micro_batch_size=2",
      bin_dir(), testing::source_dir(), config, flags, n_layers));
}

// The `profile: KIND key=value ...` lines: kind -> key -> value.
std::map<std::string, std::map<std::string, double>> profile_lines(const std::string& output) {
  std::map<std::string, std::map<std::string, double>> rows;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string tag, kind, field;
    if (!(words >> tag >> kind) || tag != "profile:") continue;
    while (words >> field) {
      const auto eq = field.find('=');
      if (eq != std::string::npos) rows[kind][field.substr(0, eq)] = std::stod(field.substr(eq + 1));
    }
  }
  return rows;
}

// Calls per step of each kernel for one micro-batch of an n_layers model
// (bench() runs 2 sequences of 16 rows, 4 heads: 8 (batch, head) pairs of
// one attention tile each): each layer's forward runs 3 linears, the QKV
// projection as one product per part and head, and 2 products per pair; its
// backward 2 products per linear (input and weight gradients), except that
// the output projection's input gradient is one product per head, and 5 per
// pair; the head adds a linear (1 forward, 2 backward).
void expect_structure_calls(std::map<std::string, std::map<std::string, double>>& rows, int layers,
                            int parameters) {
  const int L = layers, heads = 4, pairs = 2 * heads;
  EXPECT_EQ(rows["gemm"]["calls"], (10 + 4 * heads + 7 * pairs) * L + 3);
  EXPECT_EQ(rows["layernorm_forward"]["calls"], 2 * L + 1);
  EXPECT_EQ(rows["layernorm_backward"]["calls"], 2 * L + 1);
  EXPECT_EQ(rows["gelu_forward"]["calls"], L);
  EXPECT_EQ(rows["gelu_backward"]["calls"], L);
  EXPECT_EQ(rows["attention_forward"]["calls"], L);
  EXPECT_EQ(rows["attention_backward"]["calls"], L);
  EXPECT_EQ(rows["embedding_forward"]["calls"], 1);
  EXPECT_EQ(rows["embedding_backward"]["calls"], 1);
  EXPECT_EQ(rows["cross_entropy_forward"]["calls"], 1);
  EXPECT_EQ(rows["cross_entropy_backward"]["calls"], 1);
  EXPECT_EQ(rows["adamw"]["calls"], parameters) << "one update per parameter tensor";
  EXPECT_EQ(rows["sum_of_squares"]["calls"], L + 2) << "one per block: embeddings, layers, head";
}

void expect_shares_add_up(std::map<std::string, std::map<std::string, double>>& rows) {
  double kernels = 0.0;
  for (auto& [kind, fields] : rows) {
    if (kind == "other" || kind == "ceiling") continue;
    EXPECT_GE(fields["share"], 0.0) << kind;
    kernels += fields["share"];
  }
  EXPECT_LE(kernels, 1.0 + 1e-3) << "kernels cannot take more than the step";
  EXPECT_NEAR(kernels + rows["other"]["share"], 1.0, 1e-3) << "other is the step less the kernels";
}

// The value of a `name: value` line of the output.
double figure(const std::string& output, const std::string& name) {
  const auto at = output.find("\n" + name + ": ");
  EXPECT_NE(at, std::string::npos) << name << " missing from:\n" << output;
  return at == std::string::npos ? 0.0 : std::stod(output.substr(at + name.size() + 3));
}

// The ceiling line against the figures printed beside it: every GEMM's FLOPs
// at the GEMM peak plus the rest of the step as measured, and the model's
// FLOPs of one step (bench(): 2 x 16 tokens) over that time and the peak.
void expect_ceiling(std::map<std::string, std::map<std::string, double>>& rows, const std::string& output) {
  ASSERT_TRUE(rows.count("ceiling")) << output;
  double step_ms = rows["other"]["ms_per_step"];
  for (auto& [kind, fields] : rows) {
    if (kind != "other" && kind != "ceiling") step_ms += fields["ms_per_step"];
  }
  const double peak = figure(output, "gemm_peak_gflops") * 1e9;
  const double gemm_ms = rows["gemm"]["ms_per_step"];
  const double gemm_flops = rows["gemm"]["gflops"] * 1e9 * gemm_ms / 1e3;
  const double ceiling_ms = 1e3 * gemm_flops / peak + (step_ms - gemm_ms);
  EXPECT_NEAR(rows["ceiling"]["step_ms"], ceiling_ms, 0.01 * ceiling_ms);
  const double mfu = figure(output, "flops_per_token") * 32 / (ceiling_ms / 1e3) / peak;
  EXPECT_NEAR(rows["ceiling"]["mfu"], mfu, 0.01 * mfu);
  // The ceiling is below the step exactly when the GEMMs ran below the peak:
  // a tiny model's do, unless a busy machine measured the peak low. Which one
  // happened is in the printed figures, so this asserts no timing.
  if (rows["gemm"]["gflops"] * 1e9 < 0.99 * peak) {
    EXPECT_LT(rows["ceiling"]["step_ms"], step_ms) << output;
    EXPECT_GT(rows["ceiling"]["mfu"], figure(output, "flops_per_token") * 32 / (step_ms / 1e3) / peak) << output;
  } else if (rows["gemm"]["gflops"] * 1e9 > 1.01 * peak) {
    EXPECT_GT(rows["ceiling"]["step_ms"], step_ms) << output;
  }
}

TEST(BenchTrain, PrintsThroughputWithoutAProfileByDefault) {
  const auto r = bench("lm-small", 1, "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"tokens_per_s: ", "step_ms: ", "mfu: ", "page_faults_per_step: ", "command: "}) {
    EXPECT_THAT(r.output, HasSubstr(line));
  }
  EXPECT_THAT(r.output, Not(HasSubstr("profile:")));
}

TEST(BenchTrain, ProfileCountsEveryKernelOfTheLanguageModel) {
  for (int layers : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} layers", layers));
    const auto r = bench("lm-small", layers, "--profile");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto rows = profile_lines(r.output);
    ASSERT_TRUE(rows.count("gemm")) << r.output;
    // Untied lm: token and position tables, 12 tensors a layer, final norm's 2 and the head.
    expect_structure_calls(rows, layers, 2 + 12 * layers + 3);
    EXPECT_EQ(rows["bias_grad"]["calls"], 0)
        << "no pass of its own: qkv's bias gradient is summed in attention backward, fc1's in GELU backward, "
           "proj's and fc2's in the layernorm backward before them; the head has none";
    EXPECT_EQ(rows["residual"]["calls"], 2 * layers) << "proj's and fc2's bias gradients add the layernorm's sums";
    EXPECT_TRUE(rows["gemm"].count("gflops")) << "GEMMs report GFLOP/s";
    EXPECT_TRUE(rows["layernorm_forward"].count("gbps")) << "the rest report GB/s";
    EXPECT_FALSE(rows.count("mean_pool_forward")) << "an lm pools nothing";
    expect_shares_add_up(rows);
    expect_ceiling(rows, r.output);
    EXPECT_THAT(r.output, HasSubstr("other (not in a kernel)"));
    EXPECT_THAT(r.output, HasSubstr("--profile")) << "the printed command reproduces the run";
  }
}

TEST(BenchTrain, ProfileCountsEveryKernelOfTheClassifier) {
  const int layers = 2;
  const auto r = bench("cls-seed", layers, "--profile --set model.dropout=0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rows = profile_lines(r.output);
  // Token and position tables, 12 tensors a layer, final norm's 2 and the head's weight and bias.
  expect_structure_calls(rows, layers, 2 + 12 * layers + 4);
  EXPECT_EQ(rows["bias_grad"]["calls"], 2 * layers + 1)
      << "proj and fc2 (dropped: their gradients are their own) and the head sum their bias gradients; qkv's is "
         "summed in attention backward, fc1's in GELU backward";
  EXPECT_EQ(rows["mean_pool_forward"]["calls"], 1);
  EXPECT_EQ(rows["mean_pool_backward"]["calls"], 1);
  // After the embedding and each residual branch, in forward and again in backward.
  EXPECT_EQ(rows["dropout"]["calls"], 2 * (2 * layers + 1));
  EXPECT_EQ(rows["residual"]["calls"], 2 * layers) << "dropped branches are added on their own";
  expect_shares_add_up(rows);
}

}  // namespace
}  // namespace dtrain
