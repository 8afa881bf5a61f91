// device: cuda training against device: cpu, one process, the same trainer,
// graph and engine on both (tiny models of data_parallel_fixture.h):
//   - everywhere: device cuda with ZeRO stages 1-3 passes config validation;
//     a CPU parallel.backend with device cuda is a ConfigError naming it;
//     without the CUDA plugin (a copy of dtrain-worker away from build/lib,
//     DTRAIN_PLUGIN_DIR an empty folder) device cuda is a ConfigError naming
//     `device` and libdtrain_cuda.so; a cpu run holds no device memory;
//   - on a GPU (skipped otherwise, with the reason): 20 steps of the LM (also
//     with dropout and tied embeddings) and of the classifier follow the CPU
//     run in the same precision step by step: fp32 losses within 1e-4
//     relative, bf16 within 2%, fp16 within 1%; ZeRO stages 0-3 with
//     gradient accumulation 1 and 3 follow the CPU run at world size 1 (fp32,
//     1e-4; stage 3 also in bf16 and fp16); an nccl world of one passed in
//     trains what the trainer's own trains (1e-6), 16-bit gradients within
//     2%; decoding with the key/value cache gives the CPU's logits; a
//     checkpoint saved on cuda resumes on cpu with the same parameters and
//     continues (first step within 1e-5, then 1e-4) and resumes on cuda,
//     and one saved on cpu resumes on cuda.
#include <cmath>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "comm/connect.h"
#include "comm/memory_store.h"
#include "core/error.h"
#include "core/plugin.h"
#include "data_parallel_fixture.h"
#include "nn/transformer.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::Variant;
using worker::Trainer;

// The fixture's tiny LM (micro-batch 2) on `device`, or the classifier built from it.
config::Config tiny(const std::string& device, int stage = 0, int accum = 2, const Variant& v = {},
                    bool classifier = false) {
  config::Config c = testing::tiny_lm(testing::kMicroBatch, stage, accum, v);
  c.set_device(device);
  if (classifier) {
    c.mutable_model()->set_kind("classifier");
    c.mutable_model()->set_num_classes(4);
  }
  return c;
}

worker::TrainerOptions quiet(std::shared_ptr<comm::Communicator> comm = nullptr) {
  return {.write_outputs = false, .console = nullptr, .comm = std::move(comm)};
}

std::string field_of(const config::Config& config) {
  try {
    Trainer trainer(config, quiet());
  } catch (const ConfigError& e) {
    return e.field();
  }
  return "";
}

// ---- everywhere ----

TEST(CudaTrainingConfig, EveryZeroStagePassesValidation) {
  const std::string json = worker::config_to_json(tiny("cpu"));
  for (int stage : {0, 1, 2, 3}) {
    EXPECT_NO_THROW(worker::parse_config_json(json, {"device=cuda", fmt::format("parallel.zero_stage={}", stage)}))
        << "stage " << stage;
  }
}

TEST(CudaTrainingConfig, CpuBackendsAreRefused) {
  config::Config c = tiny("cuda");
  for (const char* backend : {"gloo", "mpi"}) {
    c.mutable_parallel()->set_backend(backend);
    EXPECT_EQ(field_of(c), "parallel.backend") << backend;
  }
}

TEST(CudaTrainingConfig, WithoutThePluginDeviceCudaIsAConfigError) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "bin");
  std::filesystem::create_directories(dir / "empty");
  std::filesystem::copy_file(testing::bin_dir() + "/dtrain-worker", dir / "bin" / "dtrain-worker");
  const auto config = dir.write("tiny.json", worker::config_to_json(tiny("cuda")));
  const testing::CommandResult r = testing::run_command(
      fmt::format("DTRAIN_PLUGIN_DIR={} {} --config {} --set train.out_dir={}", (dir / "empty").string(),
                  (dir / "bin" / "dtrain-worker").string(), config.string(), dir.file("run")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("config field 'device'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(kCudaPlugin), std::string::npos) << r.output;
}

TEST(CudaTrainingConfig, CpuRunsHoldNoDeviceMemory) {
  Trainer trainer(tiny("cpu"), quiet());
  EXPECT_FALSE(trainer.on_device());
  EXPECT_EQ(trainer.device_bytes(), 0);
}

// ---- on a GPU ----

class CudaTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "device cuda cannot run here: " << why;
  }
};

std::vector<float> losses(const config::Config& config, int steps, std::shared_ptr<comm::Communicator> comm = nullptr) {
  Trainer trainer(config, quiet(std::move(comm)));
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) out.push_back(trainer.step().loss);
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << what << ", step " << i + 1;
  }
}

double tolerance(const std::string& precision) {
  return precision == "fp32" ? 1e-4 : precision == "bf16" ? 0.02 : 0.01;
}

struct Case {
  std::string name;
  Variant variant;
  bool classifier = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }  // names the case in test output

class CudaParity : public CudaTraining, public ::testing::WithParamInterface<std::tuple<std::string, Case>> {};

TEST_P(CudaParity, FollowsTheCpuFor20Steps) {
  const auto& [precision, c] = GetParam();
  Variant v = c.variant;
  v.precision = precision;
  const std::vector<float> cpu = losses(tiny("cpu", 0, 2, v, c.classifier), 20);
  const std::vector<float> gpu = losses(tiny("cuda", 0, 2, v, c.classifier), 20);
  expect_close(gpu, cpu, tolerance(precision), c.name + " " + precision);
  EXPECT_LT(gpu.back(), gpu.front()) << "did not learn";
}

INSTANTIATE_TEST_SUITE_P(
    PrecisionsAndModels, CudaParity,
    ::testing::Combine(::testing::Values("fp32", "bf16", "fp16"),
                       ::testing::Values(Case{"lm", {}}, Case{"lm_dropout_tied", {.dropout = 0.1, .tie = true}},
                                         Case{"classifier", {}, true},
                                         Case{"llama_dropout_tied", {.dropout = 0.1, .tie = true, .llama = true}},
                                         Case{"llama_full_recompute", {.llama = true, .recompute = "full"}})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

class CudaZero : public CudaTraining, public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(CudaZero, StageAndAccumulationFollowTheCpu) {
  const auto [stage, accum] = GetParam();
  const Variant v{.bucket_mb = 0.01};  // several buckets: collectives interleave with backward
  expect_close(losses(tiny("cuda", stage, accum, v), 10), losses(tiny("cpu", stage, accum, v), 10), 1e-4,
               fmt::format("stage {}, accumulation {}", stage, accum));
}

INSTANTIATE_TEST_SUITE_P(StagesAndAccumulation, CudaZero,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 3)),
                         [](const auto& info) {
                           return fmt::format("stage{}_accum{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

TEST_F(CudaTraining, Zero3InHalfPrecisionFollowsTheCpu) {
  for (const std::string precision : {"bf16", "fp16"}) {
    const Variant v{.tie = true, .precision = precision};
    expect_close(losses(tiny("cuda", 3, 2, v), 10), losses(tiny("cpu", 3, 2, v), 10), tolerance(precision),
                 "stage 3, tied, " + precision);
  }
}

// Decoding with the key/value cache (a prompt, then one more token) gives
// the CPU's logits from the same initial parameters: within 1e-4 (absolute
// and relative; the products sum in another order).
TEST_F(CudaTraining, DecodesAsTheCpuDoes) {
  for (bool llama : {false, true}) {  // and the LLaMA family's block: rotary positions, one key/value head
    std::vector<std::vector<float>> logits;
    for (const std::string device : {"cpu", "cuda"}) {
      Trainer trainer(tiny(device, 0, 2, Variant{.llama = llama}), quiet());
      const std::int64_t vocab = trainer.model().vocab_size;
      std::unique_ptr<nn::Model> model = trainer.device().make_model(trainer.model(), trainer.layout(), 1,
                                                                      trainer.seq_len());
      model->bind(trainer.engine().pointers());
      const std::vector<std::int32_t> tokens{1, 2, 3, 4, 5, 7};
      std::vector<float> out(tokens.size() * static_cast<std::size_t>(vocab));
      model->decode(tokens.data(), 5, 0, out.data());
      model->decode(tokens.data() + 5, 1, 5, out.data() + 5 * vocab);
      logits.push_back(std::move(out));
    }
    for (std::size_t i = 0; i < logits[0].size(); ++i) {
      ASSERT_NEAR(logits[1][i], logits[0][i], 1e-4 + 1e-4 * std::abs(logits[0][i]))
          << "logit " << i << (llama ? ", llama" : "");
    }
  }
}

std::shared_ptr<comm::Communicator> nccl_world_of_one() {
  comm::CommunicatorOptions options;
  options.name = "nccl-one";
  options.timeout = 30s;
  return std::make_shared<comm::Communicator>(
      comm::make_nccl_backend(0, 1, std::make_shared<comm::MemoryStore>(), 0, 30s), options);
}

// Small buckets: several all-reduces per step, each waiting for its fence on the GPU.
TEST_F(CudaTraining, NcclWorldOfOneTrainsWhatTheTrainersOwnTrains) {
  const auto config = tiny("cuda", 0, 2, {.bucket_mb = 0.01});
  const std::vector<float> alone = losses(config, 10);
  expect_close(losses(config, 10, nccl_world_of_one()), alone, 1e-6, "nccl world of one");
  for (const char* reduce : {"bf16", "fp16"}) {
    config::Config half = config;
    half.mutable_parallel()->set_reduce_dtype(reduce);
    expect_close(losses(half, 10, nccl_world_of_one()), alone, 0.02, std::string(reduce) + " gradients");
  }
}

// Saves after 10 steps on `from`, then resumes on `to`: the same parameters,
// and the next steps follow the run that went on after the save.
void save_and_resume(const std::string& from, const std::string& to) {
  testing::TempDir dir;
  auto with = [&](const std::string& device) {
    config::Config c = tiny(device);
    c.mutable_train()->set_out_dir(dir.file("run"));
    c.mutable_checkpoint()->set_dir(dir.file("ckpt"));
    c.mutable_checkpoint()->set_resume("auto");
    return c;
  };
  Trainer saved(with(from), quiet());
  for (int i = 0; i < 10; ++i) saved.step();
  saved.save_checkpoint();
  const std::vector<float> at_save = saved.engine().gather_parameters();
  std::vector<float> after;
  for (int i = 0; i < 10; ++i) after.push_back(saved.step().loss);

  Trainer resumed(with(to), quiet());
  ASSERT_TRUE(resumed.resumed().has_value());
  EXPECT_EQ(resumed.steps_done(), 10);
  EXPECT_EQ(resumed.engine().gather_parameters(), at_save);
  std::vector<float> resumed_after;
  for (int i = 0; i < 10; ++i) resumed_after.push_back(resumed.step().loss);
  const double first = from == to ? 1e-6 : 1e-5;
  EXPECT_NEAR(resumed_after[0], after[0], first * std::abs(after[0])) << from << " -> " << to;
  expect_close(resumed_after, after, 1e-4, "resumed on " + to);
}

TEST_F(CudaTraining, CheckpointSavedOnCudaResumesOnCpuAndOnCuda) {
  save_and_resume("cuda", "cpu");
  save_and_resume("cuda", "cuda");
}

TEST_F(CudaTraining, CheckpointSavedOnCpuResumesOnCuda) { save_and_resume("cpu", "cuda"); }

}  // namespace
}  // namespace dtrain
