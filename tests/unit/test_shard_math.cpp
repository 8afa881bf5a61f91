// Shard arithmetic, and the engine's per-rank memory against the ZeRO
// paper's fp32 formulas (params 4P, grads 4P, AdamW 8P).
#include <algorithm>

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

// Every block lands in exactly one bucket, buckets are consecutive blocks in
// backward order, and no bucket passes its limit unless one block does.
void expect_plan_covers(const BucketPlan& plan, const std::vector<std::int64_t>& numel, double first_mb,
                        double mb) {
  int expected_hi = static_cast<int>(numel.size()) - 1;
  for (std::size_t i = 0; i < plan.buckets.size(); ++i) {
    const Bucket& bucket = plan.buckets[i];
    EXPECT_EQ(bucket.hi, expected_hi) << "bucket " << i;
    EXPECT_LE(bucket.lo, bucket.hi) << "bucket " << i;
    double bytes = 0.0;
    for (int b = bucket.lo; b <= bucket.hi; ++b) {
      EXPECT_EQ(plan.bucket_of[static_cast<std::size_t>(b)], static_cast<int>(i)) << "block " << b;
      bytes += 4.0 * static_cast<double>(numel[static_cast<std::size_t>(b)]);
    }
    if (bucket.lo < bucket.hi) {
      EXPECT_LE(bytes, (i == 0 ? std::min(first_mb, mb) : mb) * 1024 * 1024) << "bucket " << i;
    }
    expected_hi = bucket.lo - 1;
  }
  EXPECT_EQ(expected_hi, -1) << "blocks left outside every bucket";
}

TEST(BucketPlan, TheFirstBucketIsSmallAndTheRestFollowBucketMb) {
  constexpr std::int64_t kMiBFloats = 1024 * 1024 / 4;
  // Embeddings (2 MiB), four layers of 3 MiB, a head of 0.25 MiB.
  const std::vector<std::int64_t> numel = {2 * kMiBFloats, 3 * kMiBFloats, 3 * kMiBFloats, 3 * kMiBFloats,
                                           3 * kMiBFloats, kMiBFloats / 4};
  const BucketPlan plan = plan_buckets(numel, /*first_bucket_mb=*/1.0, /*bucket_mb=*/7.0);
  ASSERT_EQ(plan.buckets.size(), 4u);
  // The head alone: the last layer would take it past 1 MiB.
  EXPECT_EQ(plan.buckets[0].lo, 5);
  EXPECT_EQ(plan.buckets[0].hi, 5);
  // Then up to 7 MiB: two layers, two layers, the embeddings.
  EXPECT_EQ(plan.buckets[1].lo, 3);
  EXPECT_EQ(plan.buckets[2].lo, 1);
  EXPECT_EQ(plan.buckets[3].lo, 0);
  expect_plan_covers(plan, numel, 1.0, 7.0);
}

TEST(BucketPlan, EveryBlockIsInExactlyOneBucketForAnyLimits) {
  const std::vector<std::int64_t> numel = {700, 5, 300'000, 40, 262'144, 1, 90'000, 600'000, 3};
  for (const double first : {0.001, 0.5, 1.0, 25.0}) {
    for (const double mb : {0.001, 0.3, 1.0, 25.0}) {
      SCOPED_TRACE(::testing::Message() << "first_bucket_mb " << first << ", bucket_mb " << mb);
      expect_plan_covers(plan_buckets(numel, first, mb), numel, first, mb);
    }
  }
  // One bucket when both limits hold the whole model.
  EXPECT_EQ(plan_buckets(numel, 25.0, 25.0).buckets.size(), 1u);
  // bucket_mb below first_bucket_mb bounds the first bucket too: one block each.
  EXPECT_EQ(plan_buckets(numel, 1.0, 1e-9).buckets.size(), numel.size());
  // A first bucket too small for the head's block still holds it, alone.
  const BucketPlan tiny = plan_buckets(numel, 1e-9, 25.0);
  EXPECT_EQ(tiny.buckets[0].lo, 8);
  EXPECT_EQ(tiny.buckets.size(), 2u);
}

// bucket_mb bounds the later buckets, but a model of fewer than kMinBuckets
// such buckets gets buckets of a kMinBuckets-th of its gradients, never
// below the first bucket's limit.
TEST(BucketPlan, ASmallModelStillGetsSeveralBuckets) {
  constexpr std::int64_t kMiBFloats = 1024 * 1024 / 4;
  const std::vector<std::int64_t> lm_small = {2 * kMiBFloats, 3 * kMiBFloats, 3 * kMiBFloats, 3 * kMiBFloats,
                                              3 * kMiBFloats, kMiBFloats / 4};  // 14.25 MiB
  EXPECT_DOUBLE_EQ(bucket_limit_mb(lm_small, 1.0, 25.0), 14.25 / 4);
  EXPECT_EQ(plan_buckets(lm_small, 1.0, bucket_limit_mb(lm_small, 1.0, 25.0)).buckets.size(), 6u)
      << "the head, then one block each";
  EXPECT_DOUBLE_EQ(bucket_limit_mb(lm_small, 1.0, 2.0), 2.0) << "a smaller bucket_mb stays";
  const std::vector<std::int64_t> large(40, 25 * kMiBFloats);  // 1000 MiB
  EXPECT_DOUBLE_EQ(bucket_limit_mb(large, 1.0, 25.0), 25.0);
  const std::vector<std::int64_t> tiny = {kMiBFloats / 8, kMiBFloats / 8};  // 0.25 MiB
  EXPECT_DOUBLE_EQ(bucket_limit_mb(tiny, 1.0, 25.0), 1.0) << "not below the first bucket's limit";
  EXPECT_DOUBLE_EQ(bucket_limit_mb(tiny, 1.0, 0.01), 0.01);
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
        // Working buffers: two blocks of gradients (stage 2), and at stage 3
        // every one of the 6 blocks gathered (zero3_max_live_mb holds them all).
        if (stage >= 2) {
          EXPECT_LE(m.working_bytes, (stage == 3 ? 8 : 2) * 4 * P / 2);
        }
        EXPECT_EQ(m.gather_slots, stage == 3 ? 6 : 0);
      });
    }
  }
}

}  // namespace
}  // namespace dtrain
