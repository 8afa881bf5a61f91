// The data-parallel engine on the queued host device (nn/cpu/host_device.h):
// every kernel and copy runs on a queue thread behind the training thread,
// each after a delay, as on a GPU stream, so the engine's fences and waits
// between compute and communication decide the results:
//   - worlds 1-4, accumulation 1 and 3, ZeRO stages 0-3, f32 and bf16: the
//     queued run is bitwise identical to the plain run of the same config
//     (the same kernels in the same order), and in f32 it trains what one
//     rank trains with the same global batch (tolerances:
//     data_parallel_fixture.h);
//   - one fence removed (the first collective of every step queued without
//     waiting for the device's queue) makes the results differ: a missing
//     wait cannot pass these tests;
//   - with private memory (a GPU stand-in: the host reaches the state only
//     through copies) a checkpoint saved on one device type resumes on the
//     other, in both directions, as if training had not stopped.
#include <gtest/gtest.h>

#include "support/temp_dir.h"
#include "unit/data_parallel_fixture.h"

namespace dtrain {
namespace {

using namespace dtrain::testing;

constexpr int kQueuedSteps = 6;

nn::cpu::HostDeviceOptions queued(std::chrono::microseconds delay, bool private_memory = false) {
  return {.queued = true, .private_memory = private_memory, .delay = delay, .timeout = std::chrono::seconds(30)};
}

void expect_identical(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  EXPECT_EQ(a.norms, b.norms) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (std::size_t r = 0; r < a.params.size(); ++r) EXPECT_EQ(a.params[r], b.params[r]) << what << " rank " << r;
}

struct Case {
  int world;
  int accum;
  std::string precision;
  bool llama = false;  // the LLaMA family's block (Variant::llama)
};

class QueuedDataParallel : public ::testing::TestWithParam<Case> {};

TEST_P(QueuedDataParallel, TrainsBitwiseAsThePlainDeviceAndAsOneRank) {
  const Case c = GetParam();
  const Variant plain{.precision = c.precision, .steps = kQueuedSteps, .llama = c.llama};
  Variant on_queue = plain;
  on_queue.device = queued(std::chrono::microseconds(20));
  std::optional<RunResult> ref;
  if (c.precision == "fp32") ref = reference(c.world, c.accum, plain);
  for (const StageRun& s : stage_runs()) {
    const std::string what =
        fmt::format("world {} {} accum {} {}{}", c.world, s.name, c.accum, c.precision, c.llama ? " llama" : "");
    Variant plain_run = plain, queued_run = on_queue;
    plain_run.live_mb = queued_run.live_mb = s.live_mb;
    const RunResult q = train(c.world, s.stage, c.accum, queued_run);
    expect_identical(q, train(c.world, s.stage, c.accum, plain_run), what + ": queued vs plain");
    if (ref) expect_same_training(q, *ref, what + ": queued vs one rank");
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, QueuedDataParallel,
                         ::testing::ValuesIn([] {
                           std::vector<Case> cases;
                           for (const char* precision : {"fp32", "bf16"}) {
                             for (int accum : {1, 3}) {
                               for (int world = 1; world <= 4; ++world) cases.push_back({world, accum, precision});
                             }
                             // The LLaMA family's block on the queue too (its rotary and SwiGLU kernels queued).
                             cases.push_back({2, 1, precision, true});
                             cases.push_back({3, 3, precision, true});
                           }
                           return cases;
                         }()),
                         [](const auto& info) {
                           return fmt::format("world{}_accum{}_{}{}", info.param.world, info.param.accum,
                                              info.param.precision, info.param.llama ? "_llama" : "");
                         });

// Largest |a - b| over the final parameters, relative to the largest |b|.
double max_relative_difference(const RunResult& a, const RunResult& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < b.params[0].size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a.params[0][i]) - b.params[0][i]));
    scale = std::max(scale, std::abs(static_cast<double>(b.params[0][i])));
  }
  return diff / scale;
}

// The mutation the queued device exists for: the first collective of each
// step (stage 0: the gradient all-reduce; stage 3: the gather of block 0,
// which must wait for the previous step's AdamW) no longer waits for the
// device's fence. It then reads gradients or parameters the queue has not
// written yet, and the run no longer trains what the fenced one trains.
// The queue sleeps 2 ms before each item, so it lags the host by tens of ms
// at the first collective: with 300 us the comm thread, delayed by a loaded
// machine, sometimes read after the queue had caught up (4 failures in 15
// runs beside two busy loops; none in 15 with 2 ms).
TEST(QueuedDataParallelMutation, AMissingFenceBeforeACollectiveChangesTheResults) {
  for (int stage : {0, 3}) {
    Variant fenced{.steps = 3};
    fenced.device = queued(std::chrono::microseconds(2000));
    Variant unfenced = fenced;
    unfenced.unfenced_collective = 0;
    const RunResult good = train(2, stage, 1, fenced);
    const RunResult bad = train(2, stage, 1, unfenced);
    EXPECT_GT(max_relative_difference(bad, good), 1e-3) << "stage " << stage << ": the missing fence went unnoticed";
    expect_identical(good, train(2, stage, 1, Variant{.steps = 3}), fmt::format("stage {} fenced", stage));
  }
}

// Trains `steps` more steps from the checkpoint in `dir` (if any) and saves
// one at the end; the result is rank 0's view.
RunResult train_and_save(int world, int stage, int steps, const std::filesystem::path& dir,
                         std::optional<nn::cpu::HostDeviceOptions> device) {
  RunResult result;
  std::mutex mu;
  run_gloo_ranks(world, 30s, [&](comm::Communicator& comm) {
    std::shared_ptr<comm::Communicator> shared(&comm, [](comm::Communicator*) {});
    config::Config config = tiny_lm(4 / world, stage, 1, Variant{.steps = 100});
    config.mutable_checkpoint()->set_dir(dir.string());
    config.mutable_checkpoint()->set_resume("auto");
    std::shared_ptr<nn::Device> dev;
    if (device) dev = std::make_shared<nn::cpu::HostDevice>(*device);
    Trainer trainer(config, {.write_outputs = false, .console = nullptr, .comm = shared, .device = dev});
    std::vector<float> losses;
    for (int i = 0; i < steps; ++i) losses.push_back(trainer.step().loss);
    trainer.save_checkpoint();
    std::vector<float> params = trainer.engine().gather_parameters();
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) result = RunResult{losses, {}, {std::move(params)}};
  });
  return result;
}

TEST(QueuedDataParallelCheckpoint, StateSavedOnOneDeviceTypeResumesOnTheOther) {
  const auto gpu_like = queued(std::chrono::microseconds(5), /*private_memory=*/true);
  TempDir straight, there, back;
  const RunResult whole = train_and_save(1, 0, 8, straight.path(), std::nullopt);
  // Private memory -> plain, same world and stage: bitwise what one run does.
  train_and_save(1, 0, 4, there.path(), gpu_like);
  expect_identical(train_and_save(1, 0, 4, there.path(), std::nullopt),
                   RunResult{{whole.losses.begin() + 4, whole.losses.end()}, {}, whole.params},
                   "saved with private memory, resumed on the plain device");
  // Plain world 1 stage 0 -> private memory, 2 ranks at stage 3 (resharded).
  train_and_save(1, 0, 4, back.path(), std::nullopt);
  const RunResult resumed = train_and_save(2, 3, 4, back.path(), gpu_like);
  expect_same_training(RunResult{resumed.losses, resumed.losses, resumed.params},
                       RunResult{{whole.losses.begin() + 4, whole.losses.end()},
                                 {whole.losses.begin() + 4, whole.losses.end()},
                                 whole.params},
                       "saved on the plain device, resumed with private memory on 2 ranks at stage 3");
}

}  // namespace
}  // namespace dtrain
