// What the data-parallel equivalence tests share (test_data_parallel.cpp on
// the plain host device, test_data_parallel_queued.cpp on the queued one):
// a tiny LM, N ranks as threads training it, one rank training it with the
// same global batch, and the comparison of the two.
//
// Tolerance: per-step losses within 1e-5 relative; final parameters within
// 1e-5 relative in L2 norm (||a - b|| / ||b||), and no single parameter off by
// more than 1e-4 of the largest magnitude. Reductions over ranks add in
// another order than one rank's single pass, and AdamW's m / sqrt(v) turns
// last-bit differences of near-zero gradients into visible ones, so bitwise
// equality is not expected across world sizes or stages.
#pragma once

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "nn/cpu/host_device.h"
#include "support/thread_ranks.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::testing {

using namespace std::chrono_literals;
using worker::Trainer;

constexpr int kSteps = 20;
constexpr int kMicroBatch = 2;  // per rank

// What varies between runs besides world, stage and accumulation.
struct Variant {
  double bucket_mb = 25.0;
  double live_mb = 4000.0;  // parallel.zero3_max_live_mb
  double dropout = 0.0;
  bool tie = false;
  std::string precision = "fp32";
  int steps = kSteps;
  // Where each rank trains: the plain host device unless set (one device per rank).
  std::optional<nn::cpu::HostDeviceOptions> device = std::nullopt;
  int unfenced_collective = -1;  // TrainerOptions::testonly_unfenced_collective
  // The LLaMA family's block (RMSNorm, rotary positions, SwiGLU, no biases,
  // one key/value head for the three query heads) instead of today's.
  bool llama = false;
  std::string recompute = "none";  // model.recompute
};

inline config::Config tiny_lm(int micro_batch, int stage, int accum, const Variant& v = {}) {
  auto config = worker::parse_config_json(fmt::format(R"({{
    "model": {{"kind": "lm", "vocab_size": 61, "d_model": 36, "n_heads": 3,
              "n_layers": 2, "d_ff": 52, "max_seq_len": 16, "dropout": {}}},
    "data": {{"kind": "synthetic", "seq_len": 16}},
    "optimizer": {{"lr": 3e-3, "weight_decay": 0.1, "grad_clip": 1.0}},
    "schedule": {{"warmup_steps": 3}},
    "train": {{"steps": {}, "micro_batch_size": {}, "grad_accum_steps": {}, "seed": 7}},
    "parallel": {{"zero_stage": {}, "bucket_mb": {}, "zero3_max_live_mb": {}, "timeout_s": 30}}
  }})", v.dropout, v.steps, micro_batch, accum, stage, v.bucket_mb, v.live_mb), {});
  config::Model& model = *config.mutable_model();
  model.set_tie_embeddings(v.tie);
  model.set_recompute(v.recompute);
  if (v.llama) {
    model.set_norm("rmsnorm");
    model.set_position("rope");
    model.set_mlp("swiglu");
    model.set_bias(false);
    model.set_n_kv_heads(1);
  }
  config.set_precision(v.precision);
  return config;
}

// Every stage, and stage 3 twice: with every block kept gathered (the
// default) and with two gather slots that take block after block
// (parallel.zero3_max_live_mb = 0: backward gathers again, and a slot is
// refilled while kernels may still read it).
struct StageRun {
  int stage;
  double live_mb;
  std::string name;
};
inline std::vector<StageRun> stage_runs() {
  return {{0, 4000.0, "stage 0"}, {1, 4000.0, "stage 1"}, {2, 4000.0, "stage 2"},
          {3, 4000.0, "stage 3"}, {3, 0.0, "stage 3 with two gather slots"}};
}

struct RunResult {
  std::vector<float> losses;
  std::vector<float> norms;
  std::vector<std::vector<float>> params;  // per rank
  bool overlapped = false;
};

inline RunResult train(int world, int stage, int accum, const Variant& v = {}) {
  RunResult result;
  result.params.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  const int micro_batch = world == 0 ? 0 : kMicroBatch;
  testing::run_gloo_ranks(world, 30s, [&](comm::Communicator& comm) {
    std::shared_ptr<comm::Communicator> shared(&comm, [](comm::Communicator*) {});
    std::shared_ptr<nn::Device> device;
    if (v.device) device = std::make_shared<nn::cpu::HostDevice>(*v.device);
    Trainer trainer(tiny_lm(micro_batch, stage, accum, v),
                    {.write_outputs = false, .console = nullptr, .comm = shared, .device = device,
                     .testonly_unfenced_collective = v.unfenced_collective});
    std::vector<float> losses, norms;
    bool overlapped = false;
    for (int i = 0; i < v.steps; ++i) {
      const worker::StepResult r = trainer.step();
      losses.push_back(r.loss);
      norms.push_back(r.grad_norm);
      overlapped = overlapped || trainer.engine().comm_stats().overlapped;
    }
    std::vector<float> params = trainer.engine().gather_parameters();
    std::lock_guard<std::mutex> lock(mu);
    result.params[static_cast<std::size_t>(comm.rank())] = std::move(params);
    if (comm.rank() == 0) {
      result.losses = losses;
      result.norms = norms;
      result.overlapped = overlapped;
    }
  });
  return result;
}

// One rank with the same global batch: micro-batch world * B.
inline RunResult reference(int world, int accum, const Variant& v = {}) {
  RunResult result;
  Trainer trainer(tiny_lm(world * kMicroBatch, 0, accum, v),
                  {.write_outputs = false, .console = nullptr, .comm = nullptr});
  for (int i = 0; i < v.steps; ++i) {
    const worker::StepResult r = trainer.step();
    result.losses.push_back(r.loss);
    result.norms.push_back(r.grad_norm);
  }
  result.params.push_back(trainer.engine().gather_parameters());
  return result;
}

inline void expect_same_training(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::abs(b.losses[i])) << what << " step " << i + 1;
    EXPECT_NEAR(a.norms[i], b.norms[i], 1e-4 * std::abs(b.norms[i])) << what << " step " << i + 1;
  }
  const auto& pa = a.params[0];
  const auto& pb = b.params[0];
  ASSERT_EQ(pa.size(), pb.size());
  double scale = 0.0, diff = 0.0, norm = 0.0, diff_norm = 0.0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const double d = static_cast<double>(pa[i]) - pb[i];
    scale = std::max(scale, std::abs(static_cast<double>(pb[i])));
    diff = std::max(diff, std::abs(d));
    norm += static_cast<double>(pb[i]) * pb[i];
    diff_norm += d * d;
  }
  EXPECT_LE(std::sqrt(diff_norm / norm), 1e-5) << what << ": final parameters differ";
  EXPECT_LE(diff, 1e-4 * scale) << what << ": a final parameter differs";
}

}  // namespace dtrain::testing
