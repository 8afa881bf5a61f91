// Shard arithmetic, and the engine's per-rank memory against the ZeRO
// paper's fp32 formulas (params 4P, grads 4P, AdamW 8P).
#include <gtest/gtest.h>

#include "sharding/shard_math.h"
#include "support/thread_ranks.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain {
namespace {

using namespace sharding;

TEST(ShardMath, SlicesArePaddedEvenlyAndCoverTheBlockOnce) {
  for (std::int64_t numel : {0, 1, 2, 7, 10, 1000003}) {
    for (int world : {1, 2, 3, 4, 7}) {
      EXPECT_EQ(padded_size(numel, world) % world, 0);
      EXPECT_GE(padded_size(numel, world), numel);
      EXPECT_LT(padded_size(numel, world) - numel, world);
      std::int64_t covered = 0, next = 0;
      for (int r = 0; r < world; ++r) {
        const Range slice = shard_range(numel, world, r);
        EXPECT_EQ(slice.offset, next);
        EXPECT_EQ(slice.size, shard_size(numel, world));
        next = slice.end();
        const Range own = owned_elements(numel, world, r);
        EXPECT_LE(own.end(), numel);
        if (own.size > 0) {
          EXPECT_EQ(own.offset, slice.offset);
        }
        covered += own.size;
      }
      EXPECT_EQ(covered, numel) << numel << " over " << world;
    }
  }
}

TEST(ShardMath, TheLastRankMayOwnOnlyPadding) {
  // 10 elements over 4 ranks: slices of 3; rank 3 owns element 9 only.
  EXPECT_EQ(owned_elements(10, 4, 3).size, 1);
  // 2 elements over 4 ranks: ranks 2 and 3 own nothing.
  EXPECT_EQ(owned_elements(2, 4, 2).size, 0);
  EXPECT_EQ(owned_elements(2, 4, 3).size, 0);
}

TEST(ShardMath, Intersect) {
  EXPECT_EQ(intersect({0, 10}, {5, 10}).offset, 5);
  EXPECT_EQ(intersect({0, 10}, {5, 10}).size, 5);
  EXPECT_EQ(intersect({0, 3}, {5, 10}).size, 0);
}

// Model-state bytes per rank for each stage vs the ZeRO paper's formulas,
// within 10% (padding is the only difference); working buffers separately.
TEST(EngineMemory, ModelStatesFollowTheZeroFormulas) {
  const auto config = worker::parse_config_json(R"({
    "model": {"kind": "lm", "vocab_size": 256, "d_model": 64, "n_heads": 4,
              "n_layers": 4, "d_ff": 256, "max_seq_len": 16},
    "data": {"kind": "synthetic", "seq_len": 16},
    "train": {"steps": 1, "micro_batch_size": 1}
  })", {});
  const double P = static_cast<double>(nn::declare_parameters(worker::model_config(config)).total_numel());
  for (int world : {1, 2, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      const double n = world;
      const double formula[] = {16 * P, 8 * P + 8 * P / n, 4 * P + 12 * P / n, 16 * P / n};
      testing::run_gloo_ranks(world, std::chrono::seconds(30), [&](comm::Communicator& comm) {
        auto c = config;
        c.mutable_parallel()->set_zero_stage(stage);
        std::shared_ptr<comm::Communicator> shared(&comm, [](comm::Communicator*) {});
        worker::Trainer trainer(c, {.write_outputs = false, .console = nullptr, .comm = shared});
        const MemoryStats& m = trainer.engine().memory();
        const double bytes = static_cast<double>(m.model_state_bytes());
        EXPECT_NEAR(bytes, formula[stage], 0.1 * formula[stage]) << "stage " << stage << " world " << world;
        if (stage < 2) {
          EXPECT_EQ(m.working_bytes, 0);
        }
        // Working buffers: two blocks of gradients (stage 2), and two of parameters too (stage 3).
        if (stage >= 2) {
          EXPECT_LE(m.working_bytes, (stage == 3 ? 4 : 2) * 4 * P / 2);
        }
      });
    }
  }
}

}  // namespace
}  // namespace dtrain
