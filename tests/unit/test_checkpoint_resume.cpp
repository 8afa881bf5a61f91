// Resuming training from sharded checkpoints: on the same world size and
// stage the continuation is bitwise identical to an uninterrupted run; on
// another world size or ZeRO stage it trains the same model (resharding);
// a corrupt newest step is reported and the previous one used.
#include <fstream>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using worker::Trainer;

constexpr int kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks

// llama: the LLaMA family's block (RMSNorm, rotary positions, SwiGLU, no
// biases, one key/value head for the three query heads).
config::Config tiny_lm(int world, int stage, int steps, const std::string& dir, const std::string& resume,
                       bool llama = false) {
  auto c = worker::parse_config_json(fmt::format(R"({{
    "model": {{"kind": "lm", "vocab_size": 61, "d_model": 36, "n_heads": 3,
              "n_layers": 2, "d_ff": 52, "max_seq_len": 16, "dropout": 0.1}},
    "data": {{"kind": "synthetic", "seq_len": 16}},
    "optimizer": {{"lr": 3e-3, "weight_decay": 0.1, "grad_clip": 1.0}},
    "schedule": {{"warmup_steps": 3}},
    "train": {{"steps": {}, "micro_batch_size": {}, "seed": 11}},
    "parallel": {{"zero_stage": {}, "timeout_s": 30}},
    "checkpoint": {{"dir": "{}", "every_steps": 3, "keep_last": 2, "resume": "{}"}}
  }})", steps, kGlobalBatch / world, stage, dir, resume), {});
  if (llama) {
    config::Model& m = *c.mutable_model();
    m.set_norm("rmsnorm");
    m.set_position("rope");
    m.set_mlp("swiglu");
    m.set_bias(false);
    m.set_n_kv_heads(1);
  }
  return c;
}

struct RunResult {
  std::vector<float> losses;  // of the steps this run made
  std::vector<float> params;
  std::int64_t resumed_at = -1;
};

// Trains `world` ranks (threads) on a 12-step schedule until `steps` are done
// (fewer: the run "crashes" there), resuming per `resume`.
RunResult run(int world, int stage, int steps, const std::string& dir, const std::string& resume = "auto",
              bool save = true, bool llama = false) {
  RunResult result;
  std::mutex mu;
  testing::run_gloo_ranks(world, 30s, [&](comm::Communicator& comm) {
    std::shared_ptr<comm::Communicator> shared(&comm, [](comm::Communicator*) {});
    Trainer trainer(tiny_lm(world, stage, 12, dir, resume, llama),
                    {.write_outputs = false, .console = nullptr, .comm = shared});
    std::vector<float> losses;
    while (trainer.steps_done() < steps) {
      losses.push_back(trainer.step().loss);
      if (save && trainer.steps_done() % 3 == 0) trainer.save_checkpoint();
    }
    auto params = trainer.engine().gather_parameters();
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) {
      result.losses = losses;
      result.params = std::move(params);
      result.resumed_at = trainer.resumed() ? trainer.resumed()->step : -1;
    }
  });
  return result;
}

TEST(CheckpointResume, SameWorldAndStageContinuesBitwiseIdentically) {
  for (int stage : {0, 2, 3}) {
    testing::TempDir a, b;
    const RunResult whole = run(2, stage, 12, a.str(), "none");
    run(2, stage, 6, b.str());                      // saves at 3 and 6, then "crashes"
    const RunResult rest = run(2, stage, 12, b.str());    // resume=auto: from step 6
    EXPECT_EQ(rest.resumed_at, 6);
    ASSERT_EQ(rest.losses.size(), 6u);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(rest.losses[i], whole.losses[6 + i]) << "stage " << stage << " step " << 7 + i;
    EXPECT_EQ(rest.params, whole.params) << "stage " << stage;
  }
}

// The LLaMA family's block: stopped and resumed on the same ranks, bitwise;
// resharded from 2 ranks to 3, within 1e-6.
TEST(CheckpointResume, LlamaFamilyResumesBitwiseAndReshards) {
  for (int stage : {0, 3}) {
    testing::TempDir a, b;
    const RunResult whole = run(2, stage, 12, a.str(), "none", true, true);
    run(2, stage, 6, b.str(), "auto", true, true);
    const RunResult rest = run(2, stage, 12, b.str(), "auto", true, true);
    EXPECT_EQ(rest.resumed_at, 6);
    ASSERT_EQ(rest.losses.size(), 6u);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(rest.losses[i], whole.losses[6 + i]) << "stage " << stage << " step " << 7 + i;
    EXPECT_EQ(rest.params, whole.params) << "stage " << stage;
  }
  testing::TempDir a, b;
  const RunResult whole = run(2, 1, 9, a.str(), "none", true, true);
  run(2, 1, 6, b.str(), "auto", true, true);
  const RunResult rest = run(3, 3, 9, b.str(), "auto", false, true);
  EXPECT_EQ(rest.resumed_at, 6);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(rest.losses[i], whole.losses[6 + i], 1e-6 * std::abs(whole.losses[6 + i])) << "step " << 7 + i;
  }
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < whole.params.size(); ++i) {
    diff += (rest.params[i] - whole.params[i]) * static_cast<double>(rest.params[i] - whole.params[i]);
    norm += whole.params[i] * static_cast<double>(whole.params[i]);
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-6);
}

struct Reshard {
  int from_world, from_stage, to_world, to_stage;
};

class CheckpointReshard : public ::testing::TestWithParam<Reshard> {};

// Saved by N ranks at stage s, resumed by M ranks at stage t: the next steps
// match the uninterrupted N-rank run within 1e-5 (another world size adds in
// another order, so not bitwise).
TEST_P(CheckpointReshard, ContinuesWithinToleranceOfTheUninterruptedRun) {
  const Reshard c = GetParam();
  testing::TempDir a, b;
  const RunResult whole = run(c.from_world, c.from_stage, 9, a.str(), "none");
  run(c.from_world, c.from_stage, 6, b.str());
  const RunResult rest = run(c.to_world, c.to_stage, 9, b.str(), "auto", /*save=*/false);
  EXPECT_EQ(rest.resumed_at, 6);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(rest.losses[i], whole.losses[6 + i], 1e-5 * std::abs(whole.losses[6 + i])) << "step " << 7 + i;
  }
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < whole.params.size(); ++i) {
    diff += (rest.params[i] - whole.params[i]) * static_cast<double>(rest.params[i] - whole.params[i]);
    norm += whole.params[i] * static_cast<double>(whole.params[i]);
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CheckpointReshard,
                         ::testing::Values(Reshard{4, 1, 2, 2}, Reshard{2, 0, 3, 1}, Reshard{3, 2, 1, 0},
                                           Reshard{2, 3, 2, 0}, Reshard{2, 0, 2, 3}, Reshard{2, 1, 1, 3},
                                           Reshard{2, 1, 4, 0}),
                         [](const auto& info) {
                           const Reshard& r = info.param;
                           return fmt::format("world{}_stage{}_to_world{}_stage{}", r.from_world, r.from_stage,
                                              r.to_world, r.to_stage);
                         });

class CheckpointRoundTrip : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Every stage and world size: what is saved loads back bit for bit.
TEST_P(CheckpointRoundTrip, LoadsBackExactly) {
  const auto [world, stage] = GetParam();
  testing::TempDir dir;
  const RunResult saved = run(world, stage, 3, dir.str());  // saves at step 3
  const RunResult loaded = run(world, stage, 3, dir.str(), "auto", /*save=*/false);  // resumes, no steps
  EXPECT_EQ(loaded.resumed_at, 3);
  EXPECT_TRUE(loaded.losses.empty());
  EXPECT_EQ(loaded.params, saved.params);
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, CheckpointRoundTrip,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return fmt::format("world{}_stage{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

TEST(CheckpointResume, CorruptNewestStepIsSkippedForThePreviousOne) {
  testing::TempDir dir;
  run(2, 2, 6, dir.str());  // steps 3 and 6 committed
  const auto rank_file = std::filesystem::path(dir.str()) / "step_000000006" / "rank_00001.bin";
  {
    std::fstream f(rank_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    const char bad = 0x5a;
    f.write(&bad, 1);
  }
  const auto report = checkpoint::verify_step(*checkpoint::default_env(), rank_file.parent_path());
  EXPECT_FALSE(report.ok);
  EXPECT_THAT(report.problem, ::testing::HasSubstr("rank_00001.bin"));
  const RunResult rest = run(2, 2, 6, dir.str());
  EXPECT_EQ(rest.resumed_at, 3);
  EXPECT_EQ(rest.losses.size(), 3u);
  // The corrupt step is kept aside, not deleted, and step 6 was committed again.
  EXPECT_TRUE(std::filesystem::exists(dir.file("step_000000006.corrupt")));
  EXPECT_TRUE(checkpoint::verify_step(*checkpoint::default_env(), dir.file("step_000000006")).ok);
}

TEST(CheckpointResume, ResumeFromAPathThatDoesNotVerifyFailsClearly) {
  testing::TempDir dir;
  try {
    run(1, 0, 3, dir.str(), dir.file("step_000000042"));
    FAIL() << "resumed from a step that does not exist";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("checkpoint.resume="));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("step_000000042"));
  }
}

}  // namespace
}  // namespace dtrain
