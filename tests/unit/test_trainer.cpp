// The training loop in-process: learning, gradient accumulation equivalence,
// and no fresh memory in steady-state steps.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/process.h"
#include "nn/cpu/host_device.h"
#include "nn/cpu/kernel_profile.h"
#include "support/temp_dir.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::worker {
namespace {

config::Config tiny_classifier(const std::vector<std::string>& overrides = {}) {
  return parse_config_json(R"({
    "model": {"kind": "classifier", "vocab_size": 64, "d_model": 32, "n_heads": 2,
              "n_layers": 2, "d_ff": 64, "max_seq_len": 32, "num_classes": 4},
    "data": {"kind": "synthetic", "seq_len": 32},
    "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
    "schedule": {"warmup_steps": 10},
    "train": {"steps": 800, "micro_batch_size": 16, "eval_batches": 32}
  })", overrides);
}

// A resumed run's throughput counts only the steps it ran (before, every
// step since step 0 over the resumed run's time: a 4x figure after a resume
// at three quarters): the summary says how many that was.
TEST(Trainer, AResumedRunCountsOnlyTheStepsItRan) {
  testing::TempDir dir;
  const std::vector<std::string> overrides = {"train.steps=8", "checkpoint.every_steps=6", "schedule.warmup_steps=2",
                                              "checkpoint.dir=" + (dir.path() / "ck").string()};
  Trainer first(tiny_classifier(overrides), {.write_outputs = false, .console = nullptr, .comm = nullptr});
  for (int i = 0; i < 6; ++i) first.step();
  first.save_checkpoint();
  Trainer resumed(tiny_classifier(overrides), {.write_outputs = false, .console = nullptr, .comm = nullptr});
  ASSERT_TRUE(resumed.resumed().has_value());
  const TrainSummary s = resumed.run();
  EXPECT_EQ(s.steps, 8);
  EXPECT_EQ(s.steps_run, 2);
  EXPECT_GT(s.tokens_per_s, 0.0);
}

TEST(Trainer, ClassifierReaches99PercentOnTheSyntheticTask) {
  Trainer trainer(tiny_classifier(), {.write_outputs = false, .console = nullptr, .comm = nullptr});
  for (int i = 0; i < 800; ++i) trainer.step();
  const EvalResult e = trainer.evaluate();
  ASSERT_TRUE(e.accuracy.has_value());
  EXPECT_GE(*e.accuracy, 0.99) << "eval loss " << e.loss;
}

// The matmuls keep weights in oneDNN's layout under a version per block
// (cpu::gemm_weights): every update must draw a new one for every block, or
// the next forward would multiply by the weights before the step; and no two
// blocks may share one (stage 3 gathers block after block into the same
// slot: the next test).
TEST(Trainer, EveryOptimizerStepDrawsANewWeightsVersion) {
  for (const char* stage : {"0", "3"}) {
    for (const char* precision : {"fp32", "bf16"}) {
      Trainer trainer(tiny_classifier({std::string("precision=") + precision,
                                       std::string("parallel.zero_stage=") + stage}),
                      {.write_outputs = false, .console = nullptr, .comm = nullptr});
      const nn::BlockPointers pointers = trainer.engine().pointers();
      ASSERT_NE(pointers.weights_version, nullptr) << precision;
      const std::set<std::uint64_t> distinct(pointers.weights_version,
                                             pointers.weights_version + pointers.params.size());
      EXPECT_EQ(distinct.size(), pointers.params.size()) << "blocks must not share a version";
      for (int i = 0; i < 3; ++i) {
        const std::vector<std::uint64_t> before(pointers.weights_version,
                                                pointers.weights_version + pointers.params.size());
        trainer.step();
        for (std::size_t b = 0; b < before.size(); ++b) {
          EXPECT_NE(before[b], 0u);
          EXPECT_NE(pointers.weights_version[b], before[b])
              << "stage " << stage << ", " << precision << ", step " << i + 1 << ", block " << b;
        }
      }
    }
  }
}

// Stage 3's gather slots hold layer after layer at the same address when
// they are fewer than the blocks, so the weight-layout copies of layers 1 and
// 3 are one cache entry: their versions must differ, or layer 3 would
// multiply by layer 1's weights; and backward must gather again exactly the
// blocks no longer kept. Four layers (six blocks of at most 0.033 MB), one
// rank, with 2, 3 and 6 slots: stage 3 trains exactly what stage 0 does.
TEST(Trainer, Stage3WithLayersSharingAGatherSlotTrainsWhatStage0Trains) {
  for (const char* precision : {"fp32", "bf16"}) {
    for (const auto& [live_mb, slots] : {std::pair{"0", 2}, std::pair{"0.1", 3}, std::pair{"4000", 6}}) {
      const std::string where = std::string(precision) + ", zero3_max_live_mb " + live_mb;
      auto with_stage = [&](const char* stage) {
        return tiny_classifier({"model.n_layers=4", std::string("precision=") + precision,
                                std::string("parallel.zero3_max_live_mb=") + live_mb,
                                std::string("parallel.zero_stage=") + stage});
      };
      Trainer stage0(with_stage("0"), {.write_outputs = false, .console = nullptr, .comm = nullptr});
      Trainer stage3(with_stage("3"), {.write_outputs = false, .console = nullptr, .comm = nullptr});
      EXPECT_EQ(stage3.engine().memory().gather_slots, slots) << where;
      for (int i = 0; i < 4; ++i) {
        const StepResult a = stage0.step();
        const StepResult b = stage3.step();
        EXPECT_EQ(a.loss, b.loss) << where << ", step " << i + 1;
      }
      EXPECT_EQ(stage0.engine().gather_parameters(), stage3.engine().gather_parameters()) << where;
    }
  }
}

// k micro-batches of B equal one batch of k*B: same samples, same update.
TEST(Trainer, GradientAccumulationEqualsTheLargerBatch) {
  Trainer big(tiny_classifier({"train.micro_batch_size=8", "train.grad_accum_steps=1"}),
              {.write_outputs = false, .console = nullptr, .comm = nullptr});
  Trainer accum(tiny_classifier({"train.micro_batch_size=4", "train.grad_accum_steps=2"}),
                {.write_outputs = false, .console = nullptr, .comm = nullptr});
  for (int i = 0; i < 3; ++i) {
    const StepResult a = big.step();
    const StepResult b = accum.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-5f * std::abs(a.loss));
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4f * a.grad_norm);
  }
  const auto pa = big.engine().gather_parameters();
  const auto pb = accum.engine().gather_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  double max_diff = 0.0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(pa[i] - pb[i])));
  }
  // Parameters are ~0.02 and move by ~lr per step; summation order differs only.
  EXPECT_LT(max_diff, 1e-5);
}

// Not in sanitizer builds: ASan's allocator quarantines freed blocks, so even
// oneDNN's few small per-call allocations land on fresh pages there.
#ifndef __SANITIZE_ADDRESS__
// Page faults over 10 steps after 3 warm-up steps (profiled: every kernel
// timed into `profile`, as dtrain-bench train --profile does).
long steady_state_faults(nn::cpu::KernelProfile* profile) {
  Trainer trainer(
      parse_config_json(R"({
        "model": {"kind": "lm", "vocab_size": 256, "d_model": 64, "n_heads": 4, "n_layers": 2,
                  "max_seq_len": 64, "dropout": 0.1},
        "data": {"kind": "synthetic", "seq_len": 64},
        "train": {"steps": 100, "micro_batch_size": 8, "grad_accum_steps": 2}
      })"),
      {.write_outputs = false, .console = nullptr, .comm = nullptr});
  for (int i = 0; i < 3; ++i) trainer.step();
  auto& device = dynamic_cast<nn::cpu::HostDevice&>(trainer.device());
  if (profile != nullptr) device.set_profile(profile);
  const long before = minor_page_faults();
  for (int i = 0; i < 10; ++i) trainer.step();
  const long faults = minor_page_faults() - before;
  device.set_profile(nullptr);
  return faults;
}

TEST(Trainer, SteadyStateStepsTouchNoFreshMemory) {
  const long faults = steady_state_faults(nullptr);
  // One step touches ~20 MB of activations (~5000 pages); allocating them per
  // step would fault thousands of pages. A handful may come from the kernel
  // (stack growth, the loader thread), never per-step buffers.
  EXPECT_LT(faults, 100) << faults << " page faults in 10 steps";
}

TEST(Trainer, ProfiledStepsTouchNoFreshMemoryEither) {
  nn::cpu::KernelProfile profile;
  const long faults = steady_state_faults(&profile);
  EXPECT_LT(faults, 100) << faults << " page faults in 10 profiled steps";
  // 2 micro-batches of 2 layers, each: 10 + 4 x 4 products a layer in its
  // linears (the QKV projection one per part and head, the output
  // projection's input gradient one per head), 7 per (batch, head) pair of
  // one attention tile (8 x 4 pairs), 3 in the head.
  EXPECT_EQ(profile[nn::cpu::KernelKind::gemm].calls, 10 * 2 * ((10 + 4 * 4 + 7 * 8 * 4) * 2 + 3));
  EXPECT_EQ(profile[nn::cpu::KernelKind::dropout].calls, 10 * 2 * 2 * (2 * 2 + 1)) << "forward and backward";
}
#endif

}  // namespace
}  // namespace dtrain::worker
