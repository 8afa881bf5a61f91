// Each mixed-precision layer against its f32 reference, in bf16 and f16.
// Tolerances (max |half - f32| / max |f32| over the output):
//   same inputs rounded, f32 output: 1e-5 (only the summation order differs);
//   a 16-bit output of exact math: one rounding, 2^-8 (bf16) / 2^-11 (f16);
//   a whole layer from f32 inputs (inputs, intermediates and outputs rounded):
//   3e-2 (bf16, 8-bit mantissa) / 5e-3 (f16, 11-bit).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "nn/attention.h"
#include "nn/cpu/convert.h"
#include "nn/cpu/matmul.h"
#include "nn/gelu.h"
#include "nn/layernorm.h"
#include "nn/linear.h"

namespace dtrain::nn {
namespace {

using Half = std::vector<std::uint16_t>;

std::vector<float> random(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Half narrow(const std::vector<float>& v, DType t) {
  Half h(v.size());
  cpu::f32_to_half(v.data(), t, h.data(), static_cast<std::int64_t>(v.size()));
  return h;
}

std::vector<float> widen(const Half& h, DType t) {
  std::vector<float> v(h.size());
  cpu::half_to_f32(h.data(), t, v.data(), static_cast<std::int64_t>(h.size()));
  return v;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return diff / scale;
}

double rounding(DType t) { return t == DType::bf16 ? 0x1p-8 : 0x1p-11; }
double layer_tolerance(DType t) { return t == DType::bf16 ? 3e-2 : 5e-3; }

class MixedPrecisionLayer : public ::testing::TestWithParam<DType> {};

TEST_P(MixedPrecisionLayer, GemmMatchesF32OnTheRoundedInputs) {
  const DType t = GetParam();
  const std::int64_t m = 37, n = 45, k = 70;
  const std::vector<float> a = widen(narrow(random(m * k, 1), t), t);
  const std::vector<float> b = widen(narrow(random(k * n, 2), t), t);
  const std::vector<float> bias = random(n, 3);
  std::vector<float> want(m * n, 0.5f), got32(m * n, 0.5f);
  cpu::Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.trans_b = true;
  g.accumulate = true;
  cpu::gemm(g, a.data(), b.data(), want.data(), bias.data());
  g.a_type = g.b_type = t;
  const Half ha = narrow(a, t), hb = narrow(b, t);
  cpu::gemm(g, static_cast<const void*>(ha.data()), hb.data(), got32.data(), bias.data());
  EXPECT_LT(rel_error(got32, want), 1e-5);
  g.accumulate = false;
  g.c_type = t;
  Half c16(m * n);
  std::vector<float> plain(m * n);
  cpu::Gemm f = g;
  f.a_type = f.b_type = f.c_type = DType::f32;
  cpu::gemm(f, a.data(), b.data(), plain.data(), bias.data());
  cpu::gemm(g, static_cast<const void*>(ha.data()), hb.data(), c16.data(), bias.data());
  EXPECT_LE(rel_error(widen(c16, t), plain), rounding(t));
}

TEST_P(MixedPrecisionLayer, LayerNormIsTheRoundedF32Result) {
  const DType t = GetParam();
  const std::int64_t n = 9, c = 48;
  const auto x = random(n * c, 4, 3.0f), w = random(c, 5), b = random(c, 6);
  std::vector<float> y(n * c), mean(n), rstd(n), mean16(n), rstd16(n);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), n, c);
  Half y16(n * c);
  cpu::with_half_format(t, [&](auto f) {
    layernorm_forward<decltype(f)>(x.data(), w.data(), b.data(), y16.data(), mean16.data(), rstd16.data(), n, c);
  });
  EXPECT_EQ(y16, narrow(y, t));
  EXPECT_EQ(mean16, mean);
  EXPECT_EQ(rstd16, rstd);
}

TEST_P(MixedPrecisionLayer, GeluForwardAndBackwardRoundOnce) {
  const DType t = GetParam();
  const std::int64_t n = 5000;
  const Half x16 = narrow(random(n, 7, 2.0f), t);
  const std::vector<float> x = widen(x16, t);
  std::vector<float> y(n), dydx(n);
  gelu_forward(x.data(), y.data(), dydx.data(), n);
  Half y16(n), d16(x16);
  cpu::with_half_format(t, [&](auto f) {  // derivative over x, in place
    gelu_forward<decltype(f)>(d16.data(), y16.data(), d16.data(), n);
  });
  EXPECT_EQ(y16, narrow(y, t));
  EXPECT_EQ(d16, narrow(dydx, t));
  const Half dy16 = narrow(random(n, 8), t);
  std::vector<float> dx(n);
  const std::vector<float> dy = widen(dy16, t), dydx_rounded = widen(d16, t);
  gelu_backward(dy.data(), dydx_rounded.data(), dx.data(), nullptr, 1, n);
  Half g16(dy16);
  cpu::with_half_format(t, [&](auto f) {
    gelu_backward<decltype(f)>(g16.data(), d16.data(), g16.data(), nullptr, 1, n);
  });
  EXPECT_EQ(g16, narrow(dx, t));
  // With a bias gradient (50 rows of 100): the column sums of the f32
  // products, before they are rounded to 16 bits, in the same order.
  const std::int64_t rows = 50, cols = 100;
  std::vector<float> db(cols, 0.0f), db16(cols, 0.0f);
  gelu_backward(dy.data(), dydx_rounded.data(), dx.data(), db.data(), rows, cols);
  Half h16(dy16);
  cpu::with_half_format(t, [&](auto f) {
    gelu_backward<decltype(f)>(h16.data(), d16.data(), h16.data(), db16.data(), rows, cols);
  });
  EXPECT_EQ(h16, narrow(dx, t));
  EXPECT_EQ(db16, db);
}

TEST_P(MixedPrecisionLayer, LinearForwardAndBackwardMatchF32) {
  const DType t = GetParam();
  const std::int64_t n = 24, in = 40, out = 56;
  const auto x = random(n * in, 9), w = random(out * in, 10, 0.2f), b = random(out, 11);
  const auto dy = random(n * out, 12);
  std::vector<float> y(n * out), dx(n * in), dw(out * in, 0.0f), db(out, 0.0f);
  linear_forward(x.data(), w.data(), b.data(), y.data(), n, in, out);
  linear_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), n, in, out);
  const Half x16 = narrow(x, t), w16 = narrow(w, t), dy16 = narrow(dy, t);
  std::vector<float> y32(n * out), dx32(n * in), dw32(out * in, 0.0f), db32(out, 0.0f);
  std::vector<float> db16(out, 0.0f);
  std::vector<float> dw2(out * in, 0.0f);
  cpu::with_half_format(t, [&](auto f) {
    using F = decltype(f);
    linear_forward<F, cpu::F32Format>(x16.data(), w16.data(), b.data(), y32.data(), n, in, out);
    linear_backward<F, cpu::F32Format>(dy16.data(), x16.data(), w16.data(), dx32.data(), dw32.data(), db32.data(),
                                       n, in, out, false, dy.data());
    linear_backward<F, cpu::F32Format>(dy16.data(), x16.data(), w16.data(), nullptr, dw2.data(), db16.data(), n,
                                       in, out);
  });
  EXPECT_LT(rel_error(y32, y), layer_tolerance(t));
  EXPECT_LT(rel_error(dx32, dx), layer_tolerance(t));
  EXPECT_LT(rel_error(dw32, dw), layer_tolerance(t));
  EXPECT_LT(rel_error(db32, db), 1e-6);  // from the f32 gradient
  EXPECT_LT(rel_error(db16, db), layer_tolerance(t));
}

TEST_P(MixedPrecisionLayer, AttentionForwardAndBackwardMatchF32) {
  const DType t = GetParam();
  for (bool causal : {false, true}) {
    // T = 16: one tile; T = 80: a tile of 64 and a short one.
    for (const std::int64_t seq : {16, 80}) {
      const AttentionShape s{2, seq, 3, 8, causal};
      const std::int64_t d = s.d_model(), rows = s.batch * s.seq;
      const auto qkv = random(rows * 3 * d, 13), d_out = random(rows * d, 14);
      const auto he = static_cast<std::size_t>(s.head_elems());
      const auto re = static_cast<std::size_t>(s.row_elems());
      std::vector<float> q(he), k(he), v(he), lse(re), o(rows * d), d_qkv(rows * 3 * d);
      const AttentionSaved<float> saved{q.data(), k.data(), v.data(), lse.data()};
      attention_forward(s, qkv.data(), o.data(), saved);
      attention_backward(s, d_out.data(), d_qkv.data(), saved);

      Half q16(he), k16(he), v16(he), o16(rows * d), dqkv16(rows * 3 * d);
      std::vector<float> lse16(re);
      const AttentionSaved<std::uint16_t> saved16{q16.data(), k16.data(), v16.data(), lse16.data()};
      const Half qkv16 = narrow(qkv, t), d_out16 = narrow(d_out, t);
      cpu::with_half_format(t, [&](auto f) {
        attention_forward<decltype(f)>(s, qkv16.data(), o16.data(), saved16);
        attention_backward<decltype(f)>(s, d_out16.data(), dqkv16.data(), saved16);
      });
      const std::string what = fmt::format("causal {} seq {}", causal, seq);
      EXPECT_LT(rel_error(lse16, lse), layer_tolerance(t)) << what;
      EXPECT_LT(rel_error(widen(o16, t), o), layer_tolerance(t)) << what;
      EXPECT_LT(rel_error(widen(dqkv16, t), d_qkv), layer_tolerance(t)) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MixedPrecisionLayer, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace dtrain::nn
