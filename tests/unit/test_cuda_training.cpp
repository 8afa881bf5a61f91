// device: cuda training (worker/cuda_step.h) against device: cpu, one process:
//   - everywhere: device cuda with another ZeRO stage or a CPU backend is a
//     ConfigError naming the field; without CUDA or without a GPU, device cuda
//     is a ConfigError naming "device"; a CPU backend refuses an allreduce
//     that carries a CUDA ready event; the device state layout
//     (sharding/cuda/device_layout.h) maps every checkpoint slice of a real
//     model to its place and forms the host engine's buckets;
//   - on a GPU (skipped otherwise, with the reason): 20 steps of the tiny LM
//     (also with dropout and tied embeddings) and the tiny classifier follow
//     the CPU run in the same precision step by step: fp32 losses within 1e-4
//     relative, bf16 within 2%, fp16 within 1%; an nccl world of one (the gradient all-reduces wait
//     for their CUDA events on the GPU) trains exactly what no communicator
//     trains; a checkpoint saved on cuda resumes on cpu with the same
//     parameters and continues (first step within 1e-5, then fp32 parity),
//     and resumes on cuda.
#include <chrono>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/connect.h"
#include "comm/memory_store.h"
#include "core/error.h"
#include "dtrain/config.h"
#include "nn/transformer.h"
#include "sharding/cuda/device_layout.h"
#include "sharding/shard_math.h"
#include "support/temp_dir.h"
#include "worker/config.h"
#include "worker/trainer.h"
#if DTRAIN_HAVE_CUDA
#include "comm/nccl/backend.h"
#endif

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using worker::Trainer;

config::Config tiny(const std::string& kind, std::vector<std::string> overrides = {}) {
  const bool lm = kind == "lm";
  return worker::parse_config_json(fmt::format(R"({{
    "model": {{"kind": "{}", "vocab_size": 61, "d_model": 32, "n_heads": 2,
              "n_layers": 2, "d_ff": 64, "max_seq_len": 16, "num_classes": 4}},
    "data": {{"kind": "synthetic", "seq_len": 16}},
    "optimizer": {{"lr": 3e-3, "weight_decay": 0.1, "grad_clip": 1.0}},
    "schedule": {{"warmup_steps": 5}},
    "train": {{"steps": 20, "micro_batch_size": {}, "seed": 5, "grad_accum_steps": 2}},
    "parallel": {{"timeout_s": 30}}
  }})", kind, lm ? 8 : 16), overrides);
}

worker::TrainerOptions quiet(std::shared_ptr<comm::Communicator> comm = nullptr) {
  return {.write_outputs = false, .console = nullptr, .comm = std::move(comm)};
}

// Why device cuda cannot run here ("" when it can).
std::string no_gpu_reason() {
#if !DTRAIN_HAVE_CUDA
  return "dtrain was built without CUDA (DTRAIN_WITH_CUDA=OFF or no nvcc)";
#else
  std::string why;
  if (comm::nccl_backend::cuda_device_count(&why) == 0) return why;
  return "";
#endif
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

TEST(CudaTrainingConfig, OtherZeroStagesAreRefused) {
  EXPECT_EQ(field_of(tiny("lm", {"device=cuda", "parallel.zero_stage=1"})), "parallel.zero_stage");
  EXPECT_EQ(field_of(tiny("lm", {"device=cuda", "parallel.zero_stage=3"})), "parallel.zero_stage");
}

TEST(CudaTrainingConfig, CpuBackendsAreRefused) {
  EXPECT_EQ(field_of(tiny("lm", {"device=cuda", "parallel.backend=gloo"})), "parallel.backend");
  EXPECT_EQ(field_of(tiny("lm", {"device=cuda", "parallel.backend=mpi"})), "parallel.backend");
}

TEST(CudaTrainingConfig, WithoutCudaOrGpuTheDeviceIsRefused) {
  const std::string why = no_gpu_reason();
  if (!why.empty()) {
    EXPECT_EQ(field_of(tiny("lm", {"device=cuda"})), "device");
    EXPECT_EQ(field_of(tiny("classifier", {"device=cuda", "parallel.backend=nccl"})), "device");
    return;
  }
  EXPECT_EQ(field_of(tiny("lm", {"device=cuda"})), "");  // a GPU is here: it builds
}

TEST(CudaTrainingConfig, CpuRunsStayUntouched) {
  Trainer trainer(tiny("lm"), quiet());
  EXPECT_FALSE(trainer.on_device());
  EXPECT_EQ(trainer.device_bytes(), 0);
}

// Only nccl can order a collective after a CUDA event; a CPU backend refuses one
// rather than read a buffer the GPU may still be writing.
TEST(CudaTrainingConfig, CpuBackendsRefuseReadyEvents) {
  comm::CommunicatorOptions options;
  options.name = "gloo-one";
  comm::Communicator gloo(
      comm::make_gloo_backend(0, 1, std::make_shared<comm::MemoryStore>(), 30s, "127.0.0.1"), options);
  float x = 1.0f;
  int not_an_event = 0;
  EXPECT_THROW(gloo.allreduce(&x, 1, DType::f32, comm::ReduceOp::sum, &not_an_event), CommError);
  gloo.allreduce(&x, 1, DType::f32, comm::ReduceOp::sum).wait();  // without one it runs
  EXPECT_EQ(x, 1.0f);
}

// Every slice a checkpoint reads or writes lands at the layout's offsets.
TEST(CudaDeviceLayout, LocatesEverySliceOfARealModel) {
  nn::ModelConfig mc;
  mc.kind = nn::ModelConfig::Kind::lm;
  mc.tie_embeddings = true;
  const nn::ParameterLayout layout = nn::declare_parameters(mc);
  std::vector<std::int64_t> offsets, numel;
  for (int b = 0; b < layout.num_blocks(); ++b) {
    offsets.push_back(layout.block_offset(b));
    numel.push_back(layout.blocks()[static_cast<std::size_t>(b)].numel);
  }
  std::int64_t covered = 0;
  for (int world : {1, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      for (int b = 0; b < layout.num_blocks(); ++b) {
        const auto own = sharding::owned_elements(numel[static_cast<std::size_t>(b)], world, rank);
        const auto span = sharding::cuda::locate(offsets, numel, "exp_avg_sq", b, own);
        EXPECT_EQ(span.tensor, sharding::cuda::StateTensor::exp_avg_sq);
        EXPECT_EQ(span.offset, layout.block_offset(b) + own.offset);
        EXPECT_EQ(span.size, own.size);
        if (world == 3) covered += span.size;
      }
    }
  }
  EXPECT_EQ(covered, layout.total_numel());  // the ranks' slices tile the buffer
  const auto last = sharding::cuda::locate(offsets, numel, "params", layout.num_blocks() - 1,
                                           sharding::Range{1, numel.back() - 1});
  EXPECT_EQ(last.offset + last.size, layout.total_numel());
  EXPECT_EQ(sharding::cuda::locate(offsets, numel, "exp_avg", 0, {0, 0}).tensor,
            sharding::cuda::StateTensor::exp_avg);
}

TEST(CudaDeviceLayout, RefusesSlicesOutsideTheirBlockAndUnknownTensors) {
  const std::vector<std::int64_t> offsets{0, 10, 30}, numel{10, 20, 5};
  EXPECT_THROW(sharding::cuda::locate(offsets, numel, "params", 1, {15, 6}), Error);
  EXPECT_THROW(sharding::cuda::locate(offsets, numel, "params", 3, {0, 1}), Error);
  EXPECT_THROW(sharding::cuda::locate(offsets, numel, "params", -1, {0, 1}), Error);
  EXPECT_THROW(sharding::cuda::locate(offsets, numel, "grads", 0, {0, 1}), Error);
  EXPECT_EQ(sharding::cuda::locate(offsets, numel, "params", 1, {15, 5}).offset, 25);
}

// The host engine's rule: blocks from the last, a bucket closes before a
// block that would pass the limit, an oversized block stands alone.
TEST(CudaDeviceLayout, BucketsFollowTheHostEngine) {
  const double mb = 1024.0 * 1024.0;
  // 4 bytes per element: blocks of 0.25, 0.5, 1.5, 0.25, 0.5 MiB, limit 1 MiB.
  const std::vector<std::int64_t> padded{65536, 131072, 393216, 65536, 131072};
  const auto plan = sharding::plan_buckets(padded, 1.0);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].hi, 4);  // 0.5 + 0.25 = 0.75; + 1.5 would pass
  EXPECT_EQ(plan.buckets[0].lo, 3);
  EXPECT_EQ(plan.buckets[1].hi, 2);  // 1.5 alone
  EXPECT_EQ(plan.buckets[1].lo, 2);
  EXPECT_EQ(plan.buckets[2].hi, 1);  // 0.5 + 0.25
  EXPECT_EQ(plan.buckets[2].lo, 0);
  EXPECT_EQ(plan.bucket_of, (std::vector<int>{2, 2, 1, 0, 0}));
  EXPECT_EQ(sharding::plan_buckets(padded, 100.0).buckets.size(), 1u);
  EXPECT_EQ(sharding::plan_buckets(padded, 1.0 / mb).buckets.size(), padded.size());
}

// ---- on a GPU ----

class CudaTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = no_gpu_reason();
    if (!why.empty()) GTEST_SKIP() << "device cuda cannot run here: " << why;
  }
};

std::vector<float> losses(const config::Config& config, int steps,
                          std::shared_ptr<comm::Communicator> comm = nullptr) {
  Trainer trainer(config, quiet(std::move(comm)));
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) out.push_back(trainer.step().loss);
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << what << ", step " << i + 1;
  }
}

struct Case {
  std::string name;
  std::string kind;
  std::vector<std::string> overrides;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }  // names the case in test output

class CudaParity : public CudaTraining,
                   public ::testing::WithParamInterface<std::tuple<std::string, Case>> {};

TEST_P(CudaParity, FollowsTheCpuFor20Steps) {
  const auto& [precision, c] = GetParam();
  const double tolerance = precision == "fp32" ? 1e-4 : precision == "bf16" ? 0.02 : 0.01;
  std::vector<std::string> o = c.overrides;
  o.push_back("precision=" + precision);
  const std::vector<float> cpu = losses(tiny(c.kind, o), 20);
  o.push_back("device=cuda");
  const std::vector<float> gpu = losses(tiny(c.kind, o), 20);
  expect_close(gpu, cpu, tolerance, c.name + " " + precision);
  EXPECT_LT(gpu.back(), gpu.front()) << "did not learn";
}

INSTANTIATE_TEST_SUITE_P(
    PrecisionsAndModels, CudaParity,
    ::testing::Combine(::testing::Values("fp32", "bf16", "fp16"),
                       ::testing::Values(Case{"lm", "lm", {}},
                                         Case{"lm_dropout_tied", "lm", {"model.dropout=0.1", "model.tie_embeddings=true"}},
                                         Case{"classifier", "classifier", {}})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

#if DTRAIN_HAVE_CUDA
std::shared_ptr<comm::Communicator> nccl_world_of_one() {
  comm::CommunicatorOptions options;
  options.name = "nccl-one";
  options.timeout = 30s;
  return std::make_shared<comm::Communicator>(
      comm::make_nccl_backend(0, 1, std::make_shared<comm::MemoryStore>(), 0, 30s), options);
}

// Small buckets: several all-reduces per step, each waiting for its event.
TEST_F(CudaTraining, NcclWorldOfOneTrainsWhatNoCommunicatorTrains) {
  const auto config = tiny("lm", {"device=cuda", "parallel.bucket_mb=0.01"});
  const std::vector<float> alone = losses(config, 10);
  expect_close(losses(config, 10, nccl_world_of_one()), alone, 1e-6, "nccl world of one");
  const auto bf16 = tiny("lm", {"device=cuda", "parallel.bucket_mb=0.01", "parallel.reduce_dtype=bf16"});
  expect_close(losses(bf16, 10, nccl_world_of_one()), alone, 0.02, "bf16 gradients");
}
#endif

TEST_F(CudaTraining, CheckpointSavedOnCudaResumesOnCpuAndOnCuda) {
  testing::TempDir dir;
  const std::vector<std::string> where{"train.out_dir=" + dir.file("run"), "checkpoint.dir=" + dir.file("ckpt"),
                                       "checkpoint.resume=auto"};
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), where.begin(), where.end());
    return tiny("lm", o);
  };
  Trainer saved(with({"device=cuda"}), quiet());
  for (int i = 0; i < 10; ++i) saved.step();
  saved.save_checkpoint();
  const std::vector<float> at_save = saved.engine().gather_parameters();  // downloaded for the save
  std::vector<float> cuda_after;
  for (int i = 0; i < 10; ++i) cuda_after.push_back(saved.step().loss);

  Trainer cpu(with({}), quiet());
  ASSERT_TRUE(cpu.resumed().has_value());
  EXPECT_EQ(cpu.steps_done(), 10);
  EXPECT_EQ(cpu.engine().gather_parameters(), at_save);
  std::vector<float> cpu_after;
  for (int i = 0; i < 10; ++i) cpu_after.push_back(cpu.step().loss);
  EXPECT_NEAR(cpu_after[0], cuda_after[0], 1e-5 * std::abs(cuda_after[0]));
  expect_close(cpu_after, cuda_after, 1e-4, "resumed on cpu");

  Trainer again(with({"device=cuda"}), quiet());
  ASSERT_TRUE(again.resumed().has_value());
  EXPECT_NEAR(again.step().loss, cuda_after[0], 1e-6 * std::abs(cuda_after[0]));
}

}  // namespace
}  // namespace dtrain
