// nn::LossScaler against torch.cuda.amp.GradScaler's rules: start at 2^16,
// halve and skip on a non-finite step, double after growth_interval
// consecutive clean steps (the count restarts after any change), and do
// nothing at all when disabled.
#include <gtest/gtest.h>

#include "nn/loss_scaler.h"

namespace dtrain::nn {
namespace {

LossScaler enabled(std::int64_t interval = 2000) {
  LossScalerOptions o;
  o.enabled = true;
  o.growth_interval = interval;
  return LossScaler(o);
}

TEST(LossScaler, StartsAtTwoToTheSixteenth) {
  EXPECT_EQ(enabled().scale(), 65536.0);
  EXPECT_EQ(enabled().state().good_steps, 0);
}

TEST(LossScaler, DisabledKeepsScaleOneAndNeverSkips) {
  LossScaler s;
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
  s.restore({1024.0, 5});
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, OverflowHalvesAndSkips) {
  LossScaler s = enabled();
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 16384.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 16384.0);
}

TEST(LossScaler, DoublesAfterTwoThousandCleanSteps) {
  LossScaler s = enabled();
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().good_steps, 1999);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.state().good_steps, 0);
}

TEST(LossScaler, OverflowRestartsTheCleanCount) {
  LossScaler s = enabled(3);
  s.update(false);
  s.update(false);
  s.update(true);  // 32768, count reset
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 32768.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
}

TEST(LossScaler, RestoreContinuesTheSavedState) {
  LossScaler s = enabled(3);
  s.restore({512.0, 2});
  EXPECT_EQ(s.scale(), 512.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);
}

TEST(LossScaler, NeverGrowsPastFloatRange) {
  LossScaler s = enabled(1);
  s.restore({3e38, 0});
  s.update(false);
  EXPECT_EQ(s.scale(), 3e38);
}

}  // namespace
}  // namespace dtrain::nn
