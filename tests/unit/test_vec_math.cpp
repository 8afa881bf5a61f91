// nn/cpu/vec_math.h against the double-precision libm, on dense grids.
//
// Tolerances are the header's claims: fast_exp within 2 ulp of the float
// result's exponent on (-87, 88] (and within 2.5e-7 relative, ~2 ulp at the
// top of a binade); fast_erf within 4e-7 absolute on [-6, 6].
#include "nn/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <utility>
#include <vector>

namespace dtrain::nn::cpu {
namespace {

// ulp of the float nearest to r (r > 0, normal range).
double ulp_of(double r) { return std::ldexp(1.0, std::ilogb(static_cast<float>(r)) - 23); }

TEST(VecMath, ExpWithinTwoUlpOnDenseGrid) {
  constexpr long kPoints = 2'000'000;
  double worst_rel = 0.0, worst_ulp = 0.0;
  float worst_x = 0.0f;
  for (long i = 1; i <= kPoints; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / static_cast<float>(kPoints);
    const double ref = std::exp(static_cast<double>(x));
    const double err = std::fabs(static_cast<double>(fast_exp(x)) - ref);
    if (err / ref > worst_rel) {
      worst_rel = err / ref;
      worst_x = x;
    }
    worst_ulp = std::max(worst_ulp, err / ulp_of(ref));
  }
  EXPECT_LE(worst_ulp, 2.0) << "worst relative error " << worst_rel << " at x = " << worst_x;
  EXPECT_LE(worst_rel, 2.5e-7) << "at x = " << worst_x;
}

// Arguments near the range-reduction boundaries |r| = ln2/2 and small |x|,
// where a truncated polynomial or a bad Cody-Waite split shows first.
TEST(VecMath, ExpAtReductionBoundariesAndNearZero) {
  const double ln2 = std::log(2.0);
  for (int n = -120; n <= 120; ++n) {
    for (double off : {-0.5, -0.4999, 0.4999, 0.5}) {
      const auto x = static_cast<float>((n + off) * ln2);
      const double ref = std::exp(static_cast<double>(x));
      EXPECT_LE(std::fabs(fast_exp(x) - ref), 2.0 * ulp_of(ref)) << "x = " << x;
    }
  }
  for (float x : {0.0f, 1e-7f, -1e-7f, 1e-3f, -1e-3f, FLT_MIN, -FLT_MIN}) {
    const double ref = std::exp(static_cast<double>(x));
    EXPECT_LE(std::fabs(fast_exp(x) - ref), 2.0 * ulp_of(ref)) << "x = " << x;
  }
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
}

// Below -87 the result is flushed to exactly 0 (exp(-87) ~ 1.6e-38 is the
// smallest value the 2^n assembly can represent as a normal float).
TEST(VecMath, ExpUnderflowIsZeroOrTiny) {
  for (float x : {-87.0f, -87.5f, -100.0f, -1000.0f, -FLT_MAX}) {
    EXPECT_EQ(fast_exp(x), 0.0f) << "x = " << x;
  }
  for (float x = -86.999f; x < -80.0f; x += 0.25f) {
    const float y = fast_exp(x);
    EXPECT_GT(y, 0.0f) << "x = " << x;
    EXPECT_TRUE(std::isnormal(y)) << "x = " << x;
    EXPECT_LE(std::fabs(y - std::exp(static_cast<double>(x))) / std::exp(static_cast<double>(x)),
              2.5e-7)
        << "x = " << x;
  }
}

// Above 88 the input is clamped: softmax never feeds such values, but a
// stray large one must give a finite number rather than inf or garbage bits.
TEST(VecMath, ExpSaturatesAboveRange) {
  const float top = fast_exp(88.0f);
  EXPECT_NEAR(top, std::exp(88.0), 2.0 * ulp_of(std::exp(88.0)));
  for (float x : {88.5f, 100.0f, 1e6f, FLT_MAX}) {
    EXPECT_EQ(fast_exp(x), top) << "x = " << x;
    EXPECT_TRUE(std::isfinite(fast_exp(x)));
  }
}

TEST(VecMath, ErfWithin4e7AbsoluteOnDenseGrid) {
  constexpr long kPoints = 1'200'000;
  double worst = 0.0;
  float worst_x = 0.0f;
  for (long i = 0; i <= kPoints; ++i) {
    const float x = -6.0f + 12.0f * static_cast<float>(i) / static_cast<float>(kPoints);
    const double err = std::fabs(static_cast<double>(fast_erf(x)) - std::erf(static_cast<double>(x)));
    if (err > worst) {
      worst = err;
      worst_x = x;
    }
  }
  EXPECT_LE(worst, 4e-7) << "at x = " << worst_x;
}

TEST(VecMath, ErfIsOddAndSaturates) {
  for (float x : {0.1f, 0.5f, 1.0f, 2.5f, 4.0f}) EXPECT_EQ(fast_erf(-x), -fast_erf(x));
  EXPECT_EQ(fast_erf(0.0f), 0.0f);
  for (float x : {6.0f, 10.0f, 100.0f, 1e30f}) {
    EXPECT_EQ(fast_erf(x), 1.0f) << "x = " << x;
    EXPECT_EQ(fast_erf(-x), -1.0f) << "x = " << x;
  }
}

// The functions must give the same values when GCC vectorises the loop (the
// kernels call them in plain loops) as in the scalar calls above.
TEST(VecMath, VectorisedLoopMatchesScalarCalls) {
  std::vector<float> x(4099), e(x.size()), f(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -20.0f + 0.01f * static_cast<float>(i);
  for (std::size_t i = 0; i < x.size(); ++i) e[i] = fast_exp(x[i]);
  for (std::size_t i = 0; i < x.size(); ++i) f[i] = fast_erf(x[i] * 0.1f);
  for (std::size_t i = 0; i < x.size(); i += 97) {
    volatile float xi = x[i];  // keeps this call scalar
    EXPECT_EQ(e[i], fast_exp(xi)) << "x = " << x[i];
    volatile float xe = x[i] * 0.1f;
    EXPECT_EQ(f[i], fast_erf(xe)) << "x = " << x[i] * 0.1f;
  }
}

// LaneSums adds term j to lane j mod 8 in blocks, the tail to lanes 0, 1,
// ..., and the lanes in one fixed order: the same bits as that order written
// out in scalar code, for every length, through both accessors.
// Two rows of n values whose sums depend on the order they are added in.
std::pair<std::vector<float>, std::vector<float>> row_pair(std::int64_t n) {
  std::vector<float> x(static_cast<std::size_t>(n)), y(x.size());
  for (std::int64_t j = 0; j < n; ++j) {
    x[static_cast<std::size_t>(j)] = 1.0f / static_cast<float>(j + 3) + 1e4f * static_cast<float>(j % 3);
    y[static_cast<std::size_t>(j)] = 0.1f * static_cast<float>(j) - 1.7f;
  }
  return {x, y};
}

TEST(VecMath, LaneSumsAddInTheirDocumentedOrder) {
  for (std::int64_t n = 0; n <= 40; ++n) {
    const auto [x, y] = row_pair(n);
    float lane[kLanes] = {};
    const std::int64_t full = n / kLanes * kLanes;
    for (std::int64_t j = 0; j < n; ++j) {
      const auto k = static_cast<std::size_t>(j < full ? j % kLanes : j - full);
      lane[k] += x[static_cast<std::size_t>(j)] * y[static_cast<std::size_t>(j)];
    }
    const float expected = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    LaneSums plain, widened;
    plain.add(n, [&](auto at) { return at(x.data()) * at(y.data()); });
    widened.add(n, [&](auto at) { return at(x.data(), [](float v) { return v; }) * at(y.data()); });
    EXPECT_EQ(plain.total(), expected) << "n = " << n;
    EXPECT_EQ(widened.total(), expected) << "n = " << n;
  }
}

// add_pair makes both sums in one pass, each the one add() makes alone.
TEST(VecMath, AddPairGivesEachSumAsAddDoes) {
  for (std::int64_t n = 0; n <= 40; ++n) {
    const auto [x, y] = row_pair(n);
    LaneSums alone_x, alone_xy, pair_x, pair_xy;
    alone_x.add(n, [&](auto at) { return at(x.data()); });
    alone_xy.add(n, [&](auto at) { return at(x.data()) * at(y.data()); });
    add_pair(n, pair_x, pair_xy, [&](auto at) { return std::pair{at(x.data()), at(x.data()) * at(y.data())}; });
    EXPECT_EQ(pair_x.total(), alone_x.total()) << "n = " << n;
    EXPECT_EQ(pair_xy.total(), alone_xy.total()) << "n = " << n;
  }
}

// max_of is the row's maximum wherever it lies: in any lane, in the tail
// past the last full group of eight, or first; and for every length.
TEST(VecMath, MaxOfFindsTheMaximumInAnyLaneAndTheTail) {
  for (std::int64_t n = 1; n <= 40; ++n) {
    for (std::int64_t at = 0; at < n; ++at) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) x[static_cast<std::size_t>(j)] = -100.0f - static_cast<float>(j % 7);
      x[static_cast<std::size_t>(at)] = -3.5f;
      EXPECT_EQ(max_of(x.data(), n), -3.5f) << "n = " << n << ", maximum at " << at;
    }
  }
}

}  // namespace
}  // namespace dtrain::nn::cpu
