// Checkpoints as a training run makes them: background (async) saves write
// the same files as synchronous ones; a run stopped by a signal at step 20
// and resumed writes the same metrics.jsonl as 40 uninterrupted steps; a full
// disk during a save is an error on every rank and the previous checkpoint
// stays intact.
#include <csignal>
#include <iostream>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/fault_env.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"
#include "worker/config.h"
#include "worker/signals.h"
#include "worker/trainer.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using worker::Trainer;
namespace ck = checkpoint;

constexpr int kGlobalBatch = 4;

config::Config tiny_lm(int world, int stage, int steps, const std::string& out, bool async) {
  return worker::parse_config_json(fmt::format(R"({{
    "model": {{"kind": "lm", "vocab_size": 61, "d_model": 36, "n_heads": 3,
              "n_layers": 2, "d_ff": 52, "max_seq_len": 16, "dropout": 0.1}},
    "data": {{"kind": "synthetic", "seq_len": 16}},
    "optimizer": {{"lr": 3e-3, "weight_decay": 0.1, "grad_clip": 1.0}},
    "schedule": {{"warmup_steps": 3}},
    "train": {{"steps": {}, "micro_batch_size": {}, "seed": 5, "log_every": 1, "eval_every": 10,
              "eval_batches": 2, "out_dir": "{}"}},
    "parallel": {{"zero_stage": {}, "timeout_s": 30}},
    "checkpoint": {{"every_steps": 2, "keep_last": 100, "async": {}, "resume": "auto"}}
  }})", steps, kGlobalBatch / world, out, stage, async ? "true" : "false"), {});
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `world` ranks (threads) through Trainer::run().
void train(int world, const config::Config& config, worker::TrainerOptions extra = {}) {
  testing::run_gloo_ranks(world, 30s, [&](comm::Communicator& comm) {
    std::shared_ptr<comm::Communicator> shared(&comm, [](comm::Communicator*) {});
    worker::TrainerOptions options = extra;
    options.write_outputs = true;
    options.comm = shared;
    Trainer trainer(config, options);
    trainer.run();
  });
}

TEST(CheckpointTraining, AsyncAndSyncSavesWriteIdenticalFiles) {
  testing::TempDir sync_dir, async_dir;
  train(2, tiny_lm(2, 1, 6, sync_dir.str(), false));
  train(2, tiny_lm(2, 1, 6, async_dir.str(), true));
  ck::Env& env = *ck::default_env();
  const auto sync_root = sync_dir.path() / "checkpoints", async_root = async_dir.path() / "checkpoints";
  ASSERT_THAT(ck::committed_steps(env, async_root), ::testing::ElementsAre(6, 4, 2));
  ASSERT_EQ(ck::committed_steps(env, sync_root), ck::committed_steps(env, async_root));
  for (std::int64_t step : {2, 4, 6}) {
    for (int rank : {0, 1}) {
      const std::string name = ck::rank_file_name(rank);
      EXPECT_EQ(read_file(ck::step_dir(async_root, step) / name), read_file(ck::step_dir(sync_root, step) / name))
          << "step " << step << " " << name;
    }
    // The manifests differ only in when they were made and in the config
    // (out_dir, checkpoint.async).
    ck::Manifest a = ck::read_manifest(env, ck::step_dir(async_root, step));
    ck::Manifest s = ck::read_manifest(env, ck::step_dir(sync_root, step));
    for (ck::Manifest* m : {&a, &s}) {
      m->clear_created_unix_ms();
      m->clear_config_json();
    }
    EXPECT_EQ(a.SerializeAsString(), s.SerializeAsString()) << "step " << step;
  }
}

TEST(CheckpointTraining, AsyncSaveWritesWhileTrainingGoesOn) {
  testing::TempDir dir;
  testing::run_gloo_ranks(2, 30s, [&](comm::Communicator& comm) {
    std::shared_ptr<comm::Communicator> shared(&comm, [](comm::Communicator*) {});
    Trainer trainer(tiny_lm(2, 2, 1000, dir.str(), true), {.write_outputs = false, .comm = shared});
    trainer.step();
    trainer.start_checkpoint();
    EXPECT_TRUE(trainer.checkpointer().in_flight());  // returned before the commit
    // Training goes on; a step boundary where both ranks' writes are done commits it.
    while (trainer.checkpointer().in_flight() && trainer.steps_done() < 1000) trainer.step();
    EXPECT_FALSE(trainer.checkpointer().in_flight());
    EXPECT_EQ(trainer.checkpointer().last_save().step, 1);
    EXPECT_GT(trainer.checkpointer().last_save().bytes, 0u);
  });
  EXPECT_EQ(ck::read_latest(*ck::default_env(), dir.path() / "checkpoints"), 1);
  EXPECT_TRUE(ck::verify_step(*ck::default_env(), ck::step_dir(dir.path() / "checkpoints", 1)).ok);
}

// The background copy of an async save races with nothing: once
// before_update() returns, the state may change and the save still holds the
// values of the step it was started at. The state is large enough (~30 MB)
// that overwriting it without the wait would overtake the copy.
TEST(CheckpointTraining, AnUpdateAfterBeforeUpdateDoesNotReachTheAsyncSave) {
  testing::TempDir dir;
  config::Config config = tiny_lm(1, 0, 1000, dir.str(), true);
  config.mutable_model()->set_d_model(256);
  config.mutable_model()->set_n_heads(4);
  config.mutable_model()->set_n_kv_heads(4);
  config.mutable_model()->set_d_ff(1024);
  config.mutable_model()->set_n_layers(4);
  worker::TrainerOptions options;
  options.write_outputs = false;
  Trainer trainer(config, options);
  trainer.step();
  std::vector<std::vector<float>> expected;
  for (const auto& s : trainer.engine().owned_state()) expected.emplace_back(s.data, s.data + s.range.size);

  worker::Checkpointer saver(config, trainer.engine(), trainer.communicator());
  saver.start_save(7, 0, 7);
  saver.before_update();
  for (const auto& s : trainer.engine().owned_state()) std::fill(s.data, s.data + s.range.size, -1.0f);
  saver.finish_save();

  ck::Env& env = *ck::default_env();
  const auto step_dir = ck::step_dir(dir.path() / "checkpoints", 7);
  const ck::Manifest manifest = ck::read_manifest(env, step_dir);
  std::size_t i = 0;
  for (const auto& s : trainer.engine().owned_state()) {
    std::vector<float> saved(static_cast<std::size_t>(s.range.size));
    ck::read_range(env, step_dir, manifest, ck::Range{s.tensor, s.block, s.range.offset, s.range.size}, saved.data());
    const std::vector<float>& want = expected[i++];
    ASSERT_EQ(saved.size(), want.size());
    std::size_t differ = 0;  // counted, not compared whole: a failure would print millions of floats
    for (std::size_t k = 0; k < saved.size(); ++k) differ += saved[k] != want[k] ? 1 : 0;
    EXPECT_EQ(differ, 0u) << "elements of " << s.tensor << " of block " << s.block << " differ";
  }
}

// metrics.jsonl without the timing fields, which no two runs share.
std::string untimed_metrics(const std::filesystem::path& out_dir) {
  static const std::regex timing(R"re(,"(tokens_per_s|step_ms)":[^,}]*)re");
  return std::regex_replace(read_file(out_dir / "metrics.jsonl"), timing, "");
}

class CheckpointExactResume : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// 40 steps straight vs 20, stop on SIGUSR1 (save and exit), resume, 20 more.
TEST_P(CheckpointExactResume, StopAndResumeWritesTheSameMetrics) {
  const auto [stage, async] = GetParam();
  testing::TempDir straight, stopped;
  train(2, tiny_lm(2, stage, 40, straight.str(), async));
  worker::TrainerOptions stop_at_20;
  stop_at_20.after_step = [](const worker::StepResult& r) {
    if (r.step == 19) worker::request_stop(SIGUSR1);  // seen at the next step boundary
  };
  train(2, tiny_lm(2, stage, 40, stopped.str(), async), stop_at_20);
  worker::request_stop(0);
  const std::string first_half = untimed_metrics(stopped.path());
  EXPECT_THAT(first_half, ::testing::HasSubstr(R"({"step":20,)"));
  EXPECT_THAT(first_half, ::testing::Not(::testing::HasSubstr(R"({"step":21,)")));
  EXPECT_THAT(first_half, ::testing::Not(::testing::HasSubstr(R"("event":"end")")));
  train(2, tiny_lm(2, stage, 40, stopped.str(), async));  // resume=auto from step 20
  const std::string whole = untimed_metrics(straight.path());
  EXPECT_THAT(whole, ::testing::HasSubstr(R"("event":"end","step":40)"));
  EXPECT_EQ(untimed_metrics(stopped.path()), whole);
}

INSTANTIATE_TEST_SUITE_P(Stages, CheckpointExactResume,
                         ::testing::Values(std::tuple{0, false}, std::tuple{1, false}, std::tuple{2, false},
                                           std::tuple{3, false}, std::tuple{1, true}, std::tuple{3, true}),
                         [](const auto& info) {
                           return fmt::format("stage{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param) ? "async" : "sync");
                         });

class CheckpointFullDisk : public ::testing::TestWithParam<bool> {};

// The disk fills while rank files of step 4 are written: every rank gets the
// error (none waits for a commit that never comes) and step 2 stays the
// latest, intact.
TEST_P(CheckpointFullDisk, SaveFailsOnEveryRankAndThePreviousStepStays) {
  const bool async = GetParam();
  testing::TempDir dir;
  ck::FaultInjectingEnv env(ck::default_env());
  std::mutex mu;
  std::vector<std::string> errors;
  testing::run_gloo_ranks(2, 30s, [&](comm::Communicator& comm) {
    std::shared_ptr<comm::Communicator> shared(&comm, [](comm::Communicator*) {});
    Trainer trainer(tiny_lm(2, 1, 10, dir.str(), async),
                    {.write_outputs = false, .comm = shared, .checkpoint_env = &env});
    trainer.step();
    trainer.step();
    trainer.save_checkpoint();
    trainer.step();
    trainer.step();
    comm.barrier().wait();
    if (comm.rank() == 0) env.fail_nth_write(3);
    comm.barrier().wait();
    try {
      if (async) {
        trainer.start_checkpoint();
        trainer.finish_checkpoint();
      } else {
        trainer.save_checkpoint();
      }
    } catch (const IoError& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u) << "every rank learns that the save failed";
  for (const auto& e : errors) {
    EXPECT_THAT(e, ::testing::HasSubstr("No space left on device"));
    EXPECT_THAT(e, ::testing::HasSubstr("could not write its file"));
  }
  std::cout << errors[0] << "\n";
  const auto root = dir.path() / "checkpoints";
  EXPECT_THAT(ck::committed_steps(env, root), ::testing::ElementsAre(2));
  EXPECT_EQ(ck::read_latest(env, root), 2);
  EXPECT_TRUE(ck::verify_step(env, ck::step_dir(root, 2)).ok);
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, CheckpointFullDisk, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "async" : "sync"; });

}  // namespace
}  // namespace dtrain
