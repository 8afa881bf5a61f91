// nn/adamw (AdamW as torch.optim.AdamW, gradient clipping as
// torch.nn.utils.clip_grad_norm_) and nn/schedule against values computed by
// hand in double.
#include "nn/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "nn/parameters.h"
#include "nn/schedule.h"

namespace dtrain::nn {
namespace {

// -------------------------------------------------------------------- AdamW

// Three consecutive steps with weight decay against the torch.optim.AdamW
// recurrence in double (using the float hyper-parameters, promoted, so that
// only the arithmetic is compared). Gradients include 0 and tiny values where
// eps dominates the denominator. Tolerance 1e-6 relative (f32 arithmetic of a
// few operations, ~1e-7); for p the scale is max(|p|, lr), since an update
// of size ~lr is computed to 1e-7 relative whatever p is.
TEST(AdamW, ThreeStepsMatchHandComputedDouble) {
  constexpr std::int64_t n = 64;
  AdamWHyper hyper;
  hyper.lr = 1e-2f;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.99f;
  hyper.eps = 1e-8f;
  hyper.weight_decay = 0.1f;
  const float wd = 0.3f;  // the range's effective decay: hyper.weight_decay is not read
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
  for (float& x : p) x = normal(rng);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  const double lr = hyper.lr, b1 = hyper.beta1, b2 = hyper.beta2, eps = hyper.eps;
  for (std::int64_t step = 1; step <= 3; ++step) {
    for (std::int64_t i = 0; i < n; ++i) {
      g[i] = i % 8 == 0 ? 0.0f : (i % 8 == 1 ? 1e-7f * normal(rng) : normal(rng));
    }
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, hyper, wd, step);
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
    for (std::int64_t i = 0; i < n; ++i) {
      rp[i] *= 1.0 - lr * wd;
      const double m_terms = b1 * std::fabs(rm[i]) + (1.0 - b1) * std::fabs(g[i]);
      rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1.0 - b2) * static_cast<double>(g[i]) * g[i];
      rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
      // m's two terms may cancel: relative to their magnitude.
      EXPECT_NEAR(m[i], rm[i], 1e-6 * m_terms) << "step " << step << ", m[" << i << "]";
      EXPECT_NEAR(v[i], rv[i], 1e-6 * std::fabs(rv[i])) << "step " << step << ", v[" << i << "]";
      EXPECT_NEAR(p[i], rp[i], 1e-6 * std::max(std::fabs(rp[i]), lr))
          << "step " << step << ", p[" << i << "]";
    }
  }
  // First step of Adam moves each element by ~lr (m/sqrt(v) = sign(g) after
  // bias correction): a sanity check on the magnitude, independent of the reference.
  std::vector<float> p1(n, 0.0f), m1(n, 0.0f), v1(n, 0.0f), g1(n, -3.0f);
  adamw_update(p1.data(), g1.data(), m1.data(), v1.data(), n, hyper, 0.0f, 1);
  for (float x : p1) EXPECT_NEAR(x, hyper.lr, 1e-7);
}

// Two blocks, decayed and undecayed parameters; zero gradients so that only
// the decay moves anything (Adam's step is m / (sqrt(v) + eps) = 0).
TEST(AdamW, StepDecaysOnlyParametersMarkedDecay) {
  ParameterLayout layout;
  layout.begin_block("a");
  layout.add("a.weight", {3, 4}, Init::normal, true);
  layout.add("a.bias", {3}, Init::zeros, false);
  layout.begin_block("b");
  layout.add("b.norm", {5}, Init::ones, false);
  layout.add("b.weight", {2, 5}, Init::normal, true);
  const auto total = static_cast<std::size_t>(layout.total_numel());
  std::vector<float> params(total), grads(total, 0.0f), m(total, 0.0f), v(total, 0.0f);
  for (std::size_t i = 0; i < total; ++i) params[i] = 1.0f + 0.1f * static_cast<float>(i);
  const std::vector<float> before = params;
  AdamWHyper hyper;
  hyper.lr = 0.1f;
  hyper.weight_decay = 0.5f;
  adamw_step(layout, params, grads, m, v, hyper, 1);
  for (const ParamSpec& p : layout.params()) {
    const std::int64_t off = layout.block_offset(p.block) + p.offset;
    const float factor = p.decay ? 1.0f - 0.1f * 0.5f : 1.0f;
    for (std::int64_t i = off; i < off + p.numel; ++i) {
      EXPECT_FLOAT_EQ(params[i], before[i] * factor) << p.name;
    }
  }
  // With gradients: each range equals adamw_update on it with its own decay.
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (float& x : grads) x = normal(rng);
  std::vector<float> expect = params, em = m, ev = v;
  adamw_step(layout, params, grads, m, v, hyper, 2);
  for (const ParamSpec& p : layout.params()) {
    const std::int64_t off = layout.block_offset(p.block) + p.offset;
    adamw_update(expect.data() + off, grads.data() + off, em.data() + off, ev.data() + off, p.numel,
                 hyper, p.decay ? hyper.weight_decay : 0.0f, 2);
  }
  EXPECT_EQ(params, expect);
  EXPECT_EQ(m, em);
  EXPECT_EQ(v, ev);
}

// ---------------------------------------------------------------- clipping

// torch.nn.utils.clip_grad_norm_: coef = max / (norm + 1e-6), applied clamped
// to <= 1. So the factor is < 1 as soon as norm > max - 1e-6 (norm == max
// included), and 1 below; max_norm 0 disables clipping.
TEST(Clip, FactorFollowsTorchClipGradNorm) {
  EXPECT_FLOAT_EQ(clip_factor(10.0, 1.0f), static_cast<float>(1.0 / (10.0 + 1e-6)));
  EXPECT_FLOAT_EQ(clip_factor(2.5, 2.0f), static_cast<float>(2.0 / (2.5 + 1e-6)));
  EXPECT_EQ(clip_factor(0.5, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(0.0, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(0.999, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(1.0, 1.0f), static_cast<float>(1.0 / (1.0 + 1e-6)));  // torch: < 1
  EXPECT_EQ(clip_factor(1e6, 0.0f), 1.0f) << "max_norm 0 disables clipping";
}

TEST(Clip, ScaleMultipliesAndFactorOneIsANoOp) {
  std::vector<float> x{1.0f, -2.0f, 3.5f};
  scale(x.data(), 3, 0.5f);
  EXPECT_EQ(x, (std::vector<float>{0.5f, -1.0f, 1.75f}));
  scale(x.data(), 3, 1.0f);
  EXPECT_EQ(x, (std::vector<float>{0.5f, -1.0f, 1.75f}));
}

// Float partial sums over chunks of 1024: 1e-6 relative covers sqrt(1024)
// roundings of 6e-8 (the worst case, 1024 * 6e-8, does not occur for
// positive terms of similar size).
TEST(Clip, SumOfSquaresMatchesDouble) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (std::int64_t n : {0, 1, 1023, 1024, 1025, 100000}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = normal(rng);
    double ref = 0.0;
    for (float e : x) ref += static_cast<double>(e) * e;
    EXPECT_NEAR(sum_of_squares(x.data(), n), ref, 1e-6 * ref) << "n = " << n;
  }
}

// The three together clip a gradient to norm max_norm (up to the 1e-6 of torch).
TEST(Clip, ClippedGradientHasMaxNorm) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> g(5000);
  for (float& e : g) e = normal(rng);
  const double norm = std::sqrt(sum_of_squares(g.data(), 5000));
  scale(g.data(), 5000, clip_factor(norm, 1.0f));
  EXPECT_NEAR(std::sqrt(sum_of_squares(g.data(), 5000)), 1.0, 1e-5);
}

// ---------------------------------------------------------------- schedule

// Floats compared at 1e-6 relative (the schedule computes in double, returns float).
TEST(LrSchedule, WarmupIsLinearFromLrOverWarmup) {
  const LrSchedule s{2.0f, 10, 110, Decay::cosine, 0.1f};
  for (std::int64_t step = 0; step < 10; ++step) {
    EXPECT_FLOAT_EQ(s.at(step), 2.0f * static_cast<float>(step + 1) / 10.0f) << step;
  }
}

TEST(LrSchedule, CosineEndpointsAndMidpoint) {
  const LrSchedule s{2.0f, 10, 110, Decay::cosine, 0.1f};
  EXPECT_FLOAT_EQ(s.at(10), 2.0f);                                  // decay starts at lr
  EXPECT_FLOAT_EQ(s.at(60), 0.2f + 0.5f * (2.0f - 0.2f));           // halfway: the mean
  EXPECT_FLOAT_EQ(s.at(35), static_cast<float>(0.2 + 0.5 * (1.0 + std::cos(M_PI / 4)) * 1.8));
  EXPECT_FLOAT_EQ(s.at(110), 0.2f);                                 // total_steps: min lr
  EXPECT_FLOAT_EQ(s.at(10000), 0.2f) << "floor after the end";
  for (std::int64_t step = 10; step < 120; ++step) EXPECT_LE(s.at(step + 1), s.at(step)) << step;
}

TEST(LrSchedule, LinearAndConstant) {
  const LrSchedule lin{1.0f, 0, 100, Decay::linear, 0.25f};
  EXPECT_FLOAT_EQ(lin.at(0), 1.0f);
  EXPECT_FLOAT_EQ(lin.at(50), 1.0f - 0.75f * 0.5f);
  EXPECT_FLOAT_EQ(lin.at(25), 1.0f - 0.75f * 0.25f);
  EXPECT_FLOAT_EQ(lin.at(100), 0.25f);
  EXPECT_FLOAT_EQ(lin.at(500), 0.25f);
  const LrSchedule constant{1.0f, 4, 100, Decay::constant, 0.25f};
  EXPECT_FLOAT_EQ(constant.at(1), 0.5f);  // warmup still applies
  for (std::int64_t step : {4, 50, 100, 1000}) EXPECT_EQ(constant.at(step), 1.0f) << step;
}

TEST(LrSchedule, MinLrRatioIsTheFloor) {
  const LrSchedule zero{1.0f, 0, 10, Decay::cosine, 0.0f};
  EXPECT_FLOAT_EQ(zero.at(10), 0.0f);
  EXPECT_GT(zero.at(9), 0.0f);
  // No decay span at all (warmup == total): min lr right after warmup.
  const LrSchedule none{1.0f, 5, 5, Decay::cosine, 0.5f};
  EXPECT_FLOAT_EQ(none.at(4), 1.0f);
  EXPECT_FLOAT_EQ(none.at(5), 0.5f);
  for (Decay d : {Decay::cosine, Decay::linear}) {
    const LrSchedule s{3e-4f, 7, 50, d, 0.1f};
    for (std::int64_t step = 0; step < 80; ++step) EXPECT_GE(s.at(step), step < 7 ? 0.0f : 3e-5f * 0.999999f);
  }
}

}  // namespace
}  // namespace dtrain::nn
