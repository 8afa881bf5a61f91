// The LLaMA-family kernels (RMSNorm, rotary heads with grouped-query
// attention, SwiGLU), GELU's tanh form and the layernorm's eps, against
// double-precision references, and their backward passes against finite
// differences of L = sum(out * R) (unit/gradient_check.h; the analytic
// backward runs with dy = R).
//
// FD tolerances as test_layers.cpp's: h = 1e-2 on inputs of scale ~1, rel
// 2e-3 for the truncation of central differences, an absolute floor of 1e-4
// for the f32 noise of the forward. The rotary heads are linear in their
// input, so there central differences are exact up to that noise.
// 16-bit storage: the kernels compute in f32 from the widened inputs and
// round once, so a 16-bit result is the f32 kernel's result on the widened
// inputs, rounded: compared bit for bit. Other tolerances at each comparison.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "nn/cpu/convert.h"
#include "nn/gelu.h"
#include "nn/layernorm.h"
#include "nn/rmsnorm.h"
#include "nn/rotary.h"
#include "nn/swiglu.h"
#include "unit/gradient_check.h"

namespace dtrain::nn {
namespace {

using cpu::Bf16Format;
using cpu::F16Format;
using cpu::F32Format;
using testing::check_gradient;
using testing::dot;
using testing::FdTolerance;
using testing::random_normal;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const FdTolerance kFd{1e-2, 2e-3, 1e-4, 20};

template <class F>
std::vector<typename F::T> narrow(const std::vector<float>& v) {
  std::vector<typename F::T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = F::store(v[i]);
  return out;
}

template <class F>
std::vector<float> widen(const std::vector<typename F::T>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = F::load(v[i]);
  return out;
}

// Runs fn with n OpenMP threads, then restores the thread count.
template <class Fn>
void with_threads(int n, Fn&& fn) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(before);
}

// ------------------------------------------------------------------ RMSNorm

struct RmsNormCase {
  std::int64_t n = 6, c = 13;  // c: one block of eight lanes and a tail
  float eps = 1e-6f;
  std::mt19937 rng{101};
  std::vector<float> x = random_normal(rng, n * c, 2.0f, 0.5f);
  std::vector<float> w = random_normal(rng, c, 0.5f, 1.0f);
  std::vector<float> r = random_normal(rng, n * c);
  std::vector<float> y = std::vector<float>(n * c), rstd = std::vector<float>(n);

  RmsNormCase() = default;
  RmsNormCase(std::int64_t rows, std::int64_t cols)
      : n(rows), c(cols), x(random_normal(rng, n * c, 2.0f, 0.5f)), w(random_normal(rng, c, 0.5f, 1.0f)),
        r(random_normal(rng, n * c)), y(n * c), rstd(n) {}

  double loss() {
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), n, c, eps);
    return dot(y.data(), r.data(), n * c);
  }
  // dx written (or added to dx's contents), dw added to.
  void backward(std::vector<float>& dx, std::vector<float>& dw, bool accumulate) const {
    rmsnorm_backward(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), n, c, accumulate);
  }
  double ref_rstd(std::int64_t i) const {
    double sq = 0.0;
    for (std::int64_t j = 0; j < c; ++j) sq += static_cast<double>(x[i * c + j]) * x[i * c + j];
    return 1.0 / std::sqrt(sq / c + eps);
  }
};

TEST(RmsNorm, ForwardMatchesDoubleReference) {
  RmsNormCase rc;
  rc.loss();
  for (std::int64_t i = 0; i < rc.n; ++i) {
    const double rs = rc.ref_rstd(i);
    EXPECT_NEAR(rc.rstd[i], rs, 1e-6 * rs);
    for (std::int64_t j = 0; j < rc.c; ++j) {
      const double ref = rc.x[i * rc.c + j] * rs * rc.w[j];
      EXPECT_NEAR(rc.y[i * rc.c + j], ref, 1e-6 * (1.0 + std::fabs(ref))) << i << "," << j;  // a few ulp
    }
  }
}

// 16-bit outputs: the f32 result rounded once, and so within half an ulp of
// the format (2^-8 relative in bf16, 2^-11 in f16) of the reference, plus the
// f32 error.
template <class F>
void expect_rmsnorm_rounds_once(double half_ulp) {
  RmsNormCase rc;
  rc.loss();
  std::vector<typename F::T> y(rc.y.size());
  std::vector<float> rstd(rc.n), copy(rc.x.size(), kNaN);
  rmsnorm_forward<F>(rc.x.data(), rc.w.data(), y.data(), rstd.data(), rc.n, rc.c, rc.eps, copy.data());
  EXPECT_EQ(y, narrow<F>(rc.y));
  EXPECT_EQ(rstd, rc.rstd);
  EXPECT_EQ(copy, rc.x);
  for (std::int64_t i = 0; i < rc.n; ++i) {
    for (std::int64_t j = 0; j < rc.c; ++j) {
      const double ref = rc.x[i * rc.c + j] * rc.ref_rstd(i) * rc.w[j];
      EXPECT_NEAR(F::load(y[i * rc.c + j]), ref, half_ulp * std::fabs(ref) + 1e-6) << i << "," << j;
    }
  }
}

TEST(RmsNorm, SixteenBitOutputsAreTheF32ResultRoundedOnce) {
  expect_rmsnorm_rounds_once<Bf16Format>(0x1p-8);
  expect_rmsnorm_rounds_once<F16Format>(0x1p-11);
}

TEST(RmsNorm, CopiesTheResidualStreamInTheSamePass) {
  RmsNormCase rc;
  rc.loss();
  std::vector<float> y(rc.y.size()), rstd(rc.n), copy(rc.x.size(), -1.0f);
  rmsnorm_forward(rc.x.data(), rc.w.data(), y.data(), rstd.data(), rc.n, rc.c, rc.eps, copy.data());
  EXPECT_EQ(copy, rc.x);
  EXPECT_EQ(y, rc.y);
  EXPECT_EQ(rstd, rc.rstd);
}

// dx = rstd (g - x rstd^2 mean(g x)), g = dy w; dw = sum_rows dy x rstd, in
// double: 1e-5 of the scale of the terms (|g| ~ 1, rstd ~ 0.5).
TEST(RmsNorm, BackwardMatchesDoubleReference) {
  RmsNormCase rc;
  rc.loss();
  std::vector<float> dx(rc.x.size(), kNaN), dw(rc.c, 0.0f);
  rc.backward(dx, dw, false);
  std::vector<double> dw_ref(rc.c, 0.0);
  for (std::int64_t i = 0; i < rc.n; ++i) {
    const double rs = rc.ref_rstd(i);
    double gx = 0.0;
    for (std::int64_t j = 0; j < rc.c; ++j) gx += static_cast<double>(rc.r[i * rc.c + j]) * rc.w[j] * rc.x[i * rc.c + j];
    gx /= rc.c;
    for (std::int64_t j = 0; j < rc.c; ++j) {
      const double xv = rc.x[i * rc.c + j], g = static_cast<double>(rc.r[i * rc.c + j]) * rc.w[j];
      EXPECT_NEAR(dx[i * rc.c + j], rs * (g - xv * rs * rs * gx), 1e-5) << i << "," << j;
      dw_ref[j] += rc.r[i * rc.c + j] * xv * rs;
    }
  }
  for (std::int64_t j = 0; j < rc.c; ++j) EXPECT_NEAR(dw[j], dw_ref[j], 1e-5) << j;
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  RmsNormCase rc;
  rc.loss();
  std::vector<float> dx(rc.x.size()), dw(rc.c, 0.0f);
  rc.backward(dx, dw, false);
  std::mt19937 rng(5);
  auto loss = [&] { return rc.loss(); };
  check_gradient("dx", rc.x.data(), dx.data(), rc.n * rc.c, loss, kFd, rng);
  check_gradient("dweight", rc.w.data(), dw.data(), rc.c, loss, kFd, rng);
}

// accumulate_dx adds to dx; dweight is always added to (1e-6: an FMA may
// round the add once where the test rounds twice).
TEST(RmsNorm, BackwardAccumulates) {
  RmsNormCase rc;
  rc.loss();
  std::vector<float> dx(rc.x.size()), dw(rc.c, 0.0f);
  rc.backward(dx, dw, false);
  std::vector<float> dx2(rc.x.size(), 0.5f), dw2(rc.c, -0.25f);
  rc.backward(dx2, dw2, true);
  for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], 0.5f + dx[i], 1e-6);
  for (std::int64_t j = 0; j < rc.c; ++j) EXPECT_NEAR(dw2[j], -0.25f + dw[j], 1e-6);
}

// Enough rows that the forward splits across threads: the same bits.
TEST(RmsNorm, OneAndTwoThreadsAgreeBitwise) {
  std::vector<float> y[2], rstd[2], dx[2], dw[2];
  for (int t : {1, 2}) {
    with_threads(t, [&] {
      RmsNormCase rc(300, 259);
      rc.loss();
      std::vector<float> g(rc.x.size()), gw(rc.c, 0.0f);
      rc.backward(g, gw, false);
      y[t - 1] = rc.y;
      rstd[t - 1] = rc.rstd;
      dx[t - 1] = g;
      dw[t - 1] = gw;
    });
  }
  EXPECT_EQ(y[0], y[1]);
  EXPECT_EQ(rstd[0], rstd[1]);
  EXPECT_EQ(dx[0], dx[1]);
  EXPECT_EQ(dw[0], dw[1]);
}

// ---------------------------------------------------------------- LayerNorm

// A non-default eps (1e-2, large enough to change every output by ~1e-3).
TEST(LayerNorm, ForwardUsesTheGivenEps) {
  constexpr std::int64_t n = 4, c = 11;
  constexpr float eps = 1e-2f;
  std::mt19937 rng(111);
  const std::vector<float> x = random_normal(rng, n * c, 1.0f, 0.3f), w = random_normal(rng, c, 0.5f, 1.0f),
                           b = random_normal(rng, c, 0.5f);
  std::vector<float> y(n * c), mean(n), rstd(n), y_default(n * c);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), n, c, nullptr, eps);
  for (std::int64_t i = 0; i < n; ++i) {
    double m = 0.0, var = 0.0;
    for (std::int64_t j = 0; j < c; ++j) m += x[i * c + j];
    m /= c;
    for (std::int64_t j = 0; j < c; ++j) var += (x[i * c + j] - m) * (x[i * c + j] - m);
    const double rs = 1.0 / std::sqrt(var / c + eps);
    EXPECT_NEAR(rstd[i], rs, 1e-6 * rs);
    for (std::int64_t j = 0; j < c; ++j) EXPECT_NEAR(y[i * c + j], (x[i * c + j] - m) * rs * w[j] + b[j], 1e-5);
  }
  layernorm_forward(x.data(), w.data(), b.data(), y_default.data(), mean.data(), rstd.data(), n, c);
  EXPECT_NE(y, y_default);
}

// ------------------------------------------------------------- Rotary heads

// The rotary table against cos(p theta^(-2i/hd)) in double. The table's
// angle is p * inv_freq in f32 (as Hugging Face's), whose inv_freq is off by
// up to ~2 ulp: the angle by ~3e-7 * p radians.
TEST(Rotary, TableMatchesTheClosedForm) {
  constexpr std::int64_t hd = 16, positions = 600;
  constexpr double theta = 10000.0;
  std::vector<float> cos(positions * hd / 2), sin(cos.size());
  rope_table(theta, hd, positions, cos.data(), sin.data());
  for (std::int64_t p = 0; p < positions; ++p) {
    for (std::int64_t i = 0; i < hd / 2; ++i) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * i / hd);
      const double tol = 3e-7 * p + 1e-7;
      EXPECT_NEAR(cos[p * hd / 2 + i], std::cos(angle), tol) << p << "," << i;
      EXPECT_NEAR(sin[p * hd / 2 + i], std::sin(angle), tol) << p << "," << i;
    }
  }
  // Position 0 is the identity; frequency 0 (i = 0) turns by p radians.
  EXPECT_EQ(cos[0], 1.0f);
  EXPECT_EQ(sin[0], 0.0f);
  EXPECT_EQ(sin[5 * hd / 2], static_cast<float>(std::sin(5.0)));
}

struct HeadsCase {
  HeadsShape s;
  bool rotate;
  std::int64_t rows() const { return s.batch * s.seq; }
  std::int64_t in_w() const { return s.packed_width(); }
  std::int64_t out_w() const { return 3 * s.heads * s.head_dim; }
  std::vector<float> cos, sin, packed, d_qkv;

  HeadsCase(std::int64_t heads, std::int64_t kv_heads, bool rotating, std::int64_t batch = 2, std::int64_t seq = 5,
            std::int64_t head_dim = 8, std::int64_t position = 3, unsigned seed = 121)
      : s{batch, seq, heads, kv_heads, head_dim, position}, rotate(rotating) {
    const std::int64_t positions = position + seq;
    cos.resize(positions * head_dim / 2);
    sin.resize(cos.size());
    rope_table(10000.0, head_dim, positions, cos.data(), sin.data());
    std::mt19937 rng(seed);
    packed = random_normal(rng, rows() * in_w());
    d_qkv = random_normal(rng, rows() * out_w());
  }
  const float* c() const { return rotate ? cos.data() : nullptr; }
  const float* sn() const { return rotate ? sin.data() : nullptr; }

  template <class F = F32Format>
  std::vector<typename F::T> forward(const std::vector<typename F::T>& in) const {
    std::vector<typename F::T> out(static_cast<std::size_t>(rows() * out_w()));
    qkv_heads_forward<F>(s, in.data(), out.data(), c(), sn());
    return out;
  }
  template <class F = F32Format>
  std::vector<typename F::T> backward(const std::vector<typename F::T>& d_out, float* d_bias = nullptr) const {
    std::vector<typename F::T> d_in(static_cast<std::size_t>(rows() * in_w()));
    qkv_heads_backward<F>(s, d_out.data(), d_in.data(), c(), sn(), d_bias);
    return d_in;
  }

  // Head vector x (hd, double) rotated at row t by +-angle, in double from the f32 table.
  std::vector<double> rotated(const float* x, std::int64_t t, double sign) const {
    const std::int64_t hd = s.head_dim, half = hd / 2;
    std::vector<double> y(x, x + hd);
    if (!rotate) return y;
    for (std::int64_t i = 0; i < half; ++i) {
      const double cs = cos[(s.position + t) * half + i], sn = sign * sin[(s.position + t) * half + i];
      y[i] = x[i] * cs - x[i + half] * sn;
      y[i + half] = x[i + half] * cs + x[i] * sn;
    }
    return y;
  }
};

// The cases every rotary test runs: (H, Hkv) = (4, 4), (4, 2), (4, 1), with
// and without rotation.
std::vector<HeadsCase> heads_cases() {
  std::vector<HeadsCase> cases;
  for (std::int64_t kv : {4, 2, 1}) {
    for (bool rotate : {true, false}) cases.emplace_back(4, kv, rotate);
  }
  return cases;
}

std::string name(const HeadsCase& hc) {
  return "H=" + std::to_string(hc.s.heads) + " Hkv=" + std::to_string(hc.s.kv_heads) +
         (hc.rotate ? " rotated" : " not rotated");
}

// Forward against a plain reference: q heads rotated, each k head rotated and
// v head copied into its group's H / Hkv slots. 1e-6: two products and a sum
// of values ~1 in f32.
TEST(Rotary, ForwardMatchesReference) {
  for (const HeadsCase& hc : heads_cases()) {
    SCOPED_TRACE(name(hc));
    const std::vector<float> qkv = hc.forward(hc.packed);
    const std::int64_t H = hc.s.heads, hd = hc.s.head_dim, group = hc.s.group();
    for (std::int64_t r = 0; r < hc.rows(); ++r) {
      const std::int64_t t = r % hc.s.seq;
      const float* in = hc.packed.data() + r * hc.in_w();
      const float* out = qkv.data() + r * hc.out_w();
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t g = h / group;
        const std::vector<double> q = hc.rotated(in + h * hd, t, 1.0), k = hc.rotated(in + (H + g) * hd, t, 1.0);
        for (std::int64_t e = 0; e < hd; ++e) {
          EXPECT_NEAR(out[h * hd + e], q[e], 1e-6) << "q row " << r << " head " << h;
          EXPECT_NEAR(out[(H + h) * hd + e], k[e], 1e-6) << "k row " << r << " head " << h;
          EXPECT_EQ(out[(2 * H + h) * hd + e], in[(H + hc.s.kv_heads + g) * hd + e]) << "v row " << r;
        }
      }
    }
  }
}

// Backward against a plain reference: the transposed rotation of each q
// head's gradient; each k and v head's group gradients summed, k's rotated
// back. 1e-5: up to four terms of ~1 summed in f32.
TEST(Rotary, BackwardMatchesReference) {
  for (const HeadsCase& hc : heads_cases()) {
    SCOPED_TRACE(name(hc));
    const std::vector<float> d_packed = hc.backward(hc.d_qkv);
    const std::int64_t H = hc.s.heads, hkv = hc.s.kv_heads, hd = hc.s.head_dim, group = hc.s.group();
    for (std::int64_t r = 0; r < hc.rows(); ++r) {
      const std::int64_t t = r % hc.s.seq;
      const float* d_out = hc.d_qkv.data() + r * hc.out_w();
      const float* d_in = d_packed.data() + r * hc.in_w();
      for (std::int64_t h = 0; h < H; ++h) {
        const std::vector<double> dq = hc.rotated(d_out + h * hd, t, -1.0);
        for (std::int64_t e = 0; e < hd; ++e) EXPECT_NEAR(d_in[h * hd + e], dq[e], 1e-6) << "q " << r << "," << h;
      }
      for (std::int64_t g = 0; g < hkv; ++g) {
        std::vector<float> dk(hd, 0.0f), dv(hd, 0.0f);
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (std::int64_t e = 0; e < hd; ++e) {
            dk[e] += d_out[(H + h) * hd + e];
            dv[e] += d_out[(2 * H + h) * hd + e];
          }
        }
        const std::vector<double> dk_ref = hc.rotated(dk.data(), t, -1.0);
        for (std::int64_t e = 0; e < hd; ++e) {
          EXPECT_NEAR(d_in[(H + g) * hd + e], dk_ref[e], 1e-5) << "k " << r << "," << g;
          EXPECT_NEAR(d_in[(H + hkv + g) * hd + e], dv[e], 1e-5) << "v " << r << "," << g;
        }
      }
    }
  }
}

// Backward is forward's adjoint: <forward(x), y> = <x, backward(y)>, within
// 1e-5 of the sum of |terms| (f32 results of values ~1).
TEST(Rotary, BackwardIsTheAdjointOfForward) {
  for (const HeadsCase& hc : heads_cases()) {
    SCOPED_TRACE(name(hc));
    const std::vector<float> qkv = hc.forward(hc.packed), d_packed = hc.backward(hc.d_qkv);
    const double lhs = dot(qkv.data(), hc.d_qkv.data(), hc.rows() * hc.out_w());
    const double rhs = dot(hc.packed.data(), d_packed.data(), hc.rows() * hc.in_w());
    double mag = 0.0;
    for (std::size_t i = 0; i < qkv.size(); ++i) mag += std::fabs(qkv[i] * hc.d_qkv[i]);
    EXPECT_NEAR(lhs, rhs, 1e-5 * mag);
  }
}

TEST(Rotary, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(7);
  for (HeadsCase hc : heads_cases()) {
    SCOPED_TRACE(name(hc));
    const std::vector<float> grad = hc.backward(hc.d_qkv);
    auto loss = [&] {
      const std::vector<float> qkv = hc.forward(hc.packed);
      return dot(qkv.data(), hc.d_qkv.data(), hc.rows() * hc.out_w());
    };
    check_gradient("d_packed", hc.packed.data(), grad.data(), hc.rows() * hc.in_w(), loss, kFd, rng);
  }
}

// d_bias: added to, the column sums of d_packed (rows in order, bit for bit
// those the test takes of the f32 result); d_packed as without it.
TEST(Rotary, BackwardSumsTheBiasGradient) {
  for (const HeadsCase& hc : heads_cases()) {
    SCOPED_TRACE(name(hc));
    const std::vector<float> plain = hc.backward(hc.d_qkv);
    std::vector<float> d_bias(hc.in_w(), 0.5f);
    EXPECT_EQ(hc.backward(hc.d_qkv, d_bias.data()), plain);
    std::vector<float> expected(hc.in_w(), 0.5f);
    for (std::int64_t r = 0; r < hc.rows(); ++r) {
      for (std::int64_t j = 0; j < hc.in_w(); ++j) expected[j] += plain[r * hc.in_w() + j];
    }
    EXPECT_EQ(d_bias, expected);
  }
}

// 16-bit storage: the f32 kernel on the widened values, rounded once; the
// bias gradient of the f32 values before rounding.
template <class F>
void expect_heads_round_once() {
  for (const HeadsCase& hc : heads_cases()) {
    SCOPED_TRACE(name(hc));
    const auto packed = narrow<F>(hc.packed), d_qkv = narrow<F>(hc.d_qkv);
    EXPECT_EQ(hc.forward<F>(packed), narrow<F>(hc.forward(widen<F>(packed))));
    std::vector<float> bias16(hc.in_w(), 0.0f), bias32(hc.in_w(), 0.0f);
    EXPECT_EQ(hc.backward<F>(d_qkv, bias16.data()), narrow<F>(hc.backward(widen<F>(d_qkv), bias32.data())));
    EXPECT_EQ(bias16, bias32);
  }
}

TEST(Rotary, SixteenBitStorageRoundsTheF32ResultOnce) {
  expect_heads_round_once<Bf16Format>();
  expect_heads_round_once<F16Format>();
}

// Enough rows that rows (forward, backward) and heads (backward with d_bias)
// split across threads: the same bits.
TEST(Rotary, OneAndTwoThreadsAgreeBitwise) {
  std::vector<float> out[2], grad[2], bias[2];
  for (int t : {1, 2}) {
    with_threads(t, [&] {
      const HeadsCase hc(4, 2, true, 2, 64, 64, 7);  // 128 rows of 512 columns
      out[t - 1] = hc.forward(hc.packed);
      bias[t - 1].assign(hc.in_w(), 0.0f);
      grad[t - 1] = hc.backward(hc.d_qkv, bias[t - 1].data());
      EXPECT_EQ(hc.backward(hc.d_qkv), grad[t - 1]);
    });
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(grad[0], grad[1]);
  EXPECT_EQ(bias[0], bias[1]);
}

// RoPE's point: the score of q rotated at position i with k rotated at j
// depends only on i - j. Through the kernel itself (one row of one head,
// position i or j). The table's f32 angles are off by ~3e-7 p radians, so
// scores agree within ~2e-5 |q| |k| at positions below 40; different
// offsets give clearly different scores.
TEST(Rotary, ScoresDependOnlyOnRelativePosition) {
  constexpr std::int64_t hd = 16, positions = 40;
  std::vector<float> cos(positions * hd / 2), sin(cos.size());
  rope_table(10000.0, hd, positions, cos.data(), sin.data());
  std::mt19937 rng(131);
  const std::vector<float> q = random_normal(rng, hd), k = random_normal(rng, hd);
  std::vector<float> packed(3 * hd, 0.0f);
  std::copy(q.begin(), q.end(), packed.begin());
  std::copy(k.begin(), k.end(), packed.begin() + hd);
  auto at = [&](std::int64_t p) {  // [q, k, v] rotated at position p
    std::vector<float> out(3 * hd);
    qkv_heads_forward(HeadsShape{1, 1, 1, 1, hd, p}, packed.data(), out.data(), cos.data(), sin.data());
    return out;
  };
  auto score = [&](std::int64_t i, std::int64_t j) { return dot(at(i).data(), at(j).data() + hd, hd); };
  const double scale = std::sqrt(dot(q.data(), q.data(), hd) * dot(k.data(), k.data(), hd));
  for (std::int64_t diff : {0, 1, 3, 7, -2, -5}) {
    const std::int64_t j0 = diff < 0 ? -diff : 0;
    const double first = score(j0 + diff, j0);
    for (std::int64_t j : {j0 + 1, j0 + 4, j0 + 13, j0 + 30}) {
      EXPECT_NEAR(score(j + diff, j), first, 2e-5 * scale) << "i - j = " << diff << ", j = " << j;
    }
  }
  EXPECT_GT(std::fabs(score(3, 0) - score(0, 0)), 1e-2 * scale);
  EXPECT_GT(std::fabs(score(0, 3) - score(3, 0)), 1e-3 * scale);  // the sign of i - j matters too
}

// ------------------------------------------------------------------- SwiGLU

struct SwigluCase {
  std::int64_t n = 5, c = 11;
  std::mt19937 rng{141};
  std::vector<float> h = random_normal(rng, n * 2 * c, 3.0f);
  std::vector<float> r = random_normal(rng, n * c);
  std::vector<float> a = std::vector<float>(n * c);

  SwigluCase() = default;
  SwigluCase(std::int64_t rows, std::int64_t cols)
      : n(rows), c(cols), h(random_normal(rng, n * 2 * c, 3.0f)), r(random_normal(rng, n * c)), a(n * c) {}

  double loss() {
    swiglu_forward(h.data(), a.data(), n, c);
    return dot(a.data(), r.data(), n * c);
  }
  std::vector<float> backward(float* d_bias = nullptr) const {
    std::vector<float> d_h(h.size(), kNaN);
    swiglu_backward(r.data(), h.data(), d_h.data(), d_bias, n, c);
    return d_h;
  }
};

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// silu(g) u in double: 1e-6 relative (fast_exp's 2 ulp, a division and two
// products), also over a sweep of the gate through [-20, 20].
TEST(Swiglu, ForwardMatchesReference) {
  SwigluCase sc;
  sc.loss();
  for (std::int64_t i = 0; i < sc.n; ++i) {
    for (std::int64_t j = 0; j < sc.c; ++j) {
      const double ref = silu(sc.h[i * 2 * sc.c + j]) * sc.h[i * 2 * sc.c + sc.c + j];
      EXPECT_NEAR(sc.a[i * sc.c + j], ref, 1e-6 * std::fabs(ref) + 1e-30) << i << "," << j;
    }
  }
  constexpr std::int64_t m = 4001;
  std::vector<float> sweep(2 * m, 1.0f), out(m);
  for (std::int64_t j = 0; j < m; ++j) sweep[j] = -20.0f + 0.01f * static_cast<float>(j);
  swiglu_forward(sweep.data(), out.data(), 1, m);
  for (std::int64_t j = 0; j < m; ++j) {
    const double ref = silu(sweep[j]);
    EXPECT_NEAR(out[j], ref, 1e-6 * std::fabs(ref) + 1e-30) << "gate " << sweep[j];
  }
}

// d_gate = da u silu'(g), d_up = da silu(g), silu'(g) = s (1 + g (1 - s)),
// s = sigmoid(g), in double: 1e-6 of the terms' magnitude (silu' crosses 0
// near g = -1.28, where no relative bound holds).
TEST(Swiglu, BackwardMatchesReferenceAndFiniteDifferences) {
  SwigluCase sc;
  const std::vector<float> d_h = sc.backward();
  for (std::int64_t i = 0; i < sc.n; ++i) {
    for (std::int64_t j = 0; j < sc.c; ++j) {
      const double g = sc.h[i * 2 * sc.c + j], u = sc.h[i * 2 * sc.c + sc.c + j], da = sc.r[i * sc.c + j];
      const double s = 1.0 / (1.0 + std::exp(-g)), terms = std::fabs(da * u) * (s + std::fabs(g * s * (1.0 - s)));
      EXPECT_NEAR(d_h[i * 2 * sc.c + j], da * u * s * (1.0 + g * (1.0 - s)), 1e-6 * terms + 1e-30) << i << "," << j;
      EXPECT_NEAR(d_h[i * 2 * sc.c + sc.c + j], da * silu(g), 1e-6 * std::fabs(da * silu(g)) + 1e-30) << i << "," << j;
    }
  }
  std::mt19937 rng(9);
  auto loss = [&] { return sc.loss(); };
  check_gradient("d_h", sc.h.data(), d_h.data(), sc.n * 2 * sc.c, loss, kFd, rng);
}

// Rows further apart than their width, padding NaN: the dense rows' results
// bit for bit, and the padding neither read nor written.
TEST(Swiglu, StridedRowsLeaveThePaddingUntouched) {
  SwigluCase sc;
  sc.loss();
  const std::int64_t n = sc.n, c = sc.c, ld_h = 2 * c + 3, ld_a = c + 5;
  std::vector<float> h(n * ld_h, kNaN), r(n * ld_a, kNaN), a(n * ld_a, kNaN), d_h(n * ld_h, kNaN);
  for (std::int64_t i = 0; i < n; ++i) {
    std::copy_n(sc.h.begin() + i * 2 * c, 2 * c, h.begin() + i * ld_h);
    std::copy_n(sc.r.begin() + i * c, c, r.begin() + i * ld_a);
  }
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "with d_bias" : "without d_bias");
    std::vector<float> db(2 * c, 0.0f), db_dense(2 * c, 0.0f);
    const std::vector<float> dense = sc.backward(bias ? db_dense.data() : nullptr);
    swiglu_forward(h.data(), a.data(), n, c, ld_h, ld_a);
    swiglu_backward(r.data(), h.data(), d_h.data(), bias ? db.data() : nullptr, n, c, ld_a, ld_h);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < c; ++j) EXPECT_EQ(a[i * ld_a + j], sc.a[i * c + j]) << i << "," << j;
      for (std::int64_t j = c; j < ld_a; ++j) EXPECT_TRUE(std::isnan(a[i * ld_a + j])) << "a padding " << i;
      for (std::int64_t j = 0; j < 2 * c; ++j) EXPECT_EQ(d_h[i * ld_h + j], dense[i * 2 * c + j]) << i << "," << j;
      for (std::int64_t j = 2 * c; j < ld_h; ++j) EXPECT_TRUE(std::isnan(d_h[i * ld_h + j])) << "d_h padding " << i;
    }
    EXPECT_EQ(db, db_dense);
  }
}

// d_bias: added to, the column sums of d_h in row order (bit for bit), which
// are the gradient of a bias added to h (checked by finite differences).
TEST(Swiglu, BackwardSumsTheBiasGradient) {
  SwigluCase sc;
  const std::vector<float> plain = sc.backward();
  std::vector<float> d_bias(2 * sc.c, 0.5f);
  EXPECT_EQ(sc.backward(d_bias.data()), plain);
  std::vector<float> expected(2 * sc.c, 0.5f);
  for (std::int64_t i = 0; i < sc.n; ++i) {
    for (std::int64_t j = 0; j < 2 * sc.c; ++j) expected[j] += plain[i * 2 * sc.c + j];
  }
  EXPECT_EQ(d_bias, expected);

  std::vector<float> bias(2 * sc.c, 0.0f), grad(2 * sc.c);
  for (std::int64_t j = 0; j < 2 * sc.c; ++j) grad[j] = d_bias[j] - 0.5f;
  const std::vector<float> h0 = sc.h;
  auto loss = [&] {
    for (std::size_t i = 0; i < h0.size(); ++i) sc.h[i] = h0[i] + bias[i % (2 * sc.c)];
    return sc.loss();
  };
  std::mt19937 rng(10);
  check_gradient("d_bias", bias.data(), grad.data(), 2 * sc.c, loss, kFd, rng);
}

template <class F>
void expect_swiglu_rounds_once() {
  SwigluCase sc;
  const auto h = narrow<F>(sc.h), da = narrow<F>(sc.r);
  const std::vector<float> h32 = widen<F>(h), da32 = widen<F>(da);
  std::vector<typename F::T> a(sc.n * sc.c), d_h(h.size());
  std::vector<float> a32(a.size()), d_h32(h.size()), bias(2 * sc.c, 0.0f), bias32(2 * sc.c, 0.0f);
  swiglu_forward<F>(h.data(), a.data(), sc.n, sc.c);
  swiglu_forward(h32.data(), a32.data(), sc.n, sc.c);
  EXPECT_EQ(a, narrow<F>(a32));
  swiglu_backward<F>(da.data(), h.data(), d_h.data(), bias.data(), sc.n, sc.c);
  swiglu_backward(da32.data(), h32.data(), d_h32.data(), bias32.data(), sc.n, sc.c);
  EXPECT_EQ(d_h, narrow<F>(d_h32));
  EXPECT_EQ(bias, bias32);
}

TEST(Swiglu, SixteenBitStorageRoundsTheF32ResultOnce) {
  expect_swiglu_rounds_once<Bf16Format>();
  expect_swiglu_rounds_once<F16Format>();
}

// Rows (forward, backward) and column blocks (backward with d_bias) split
// across threads: the same bits.
TEST(Swiglu, OneAndTwoThreadsAgreeBitwise) {
  std::vector<float> a[2], d_h[2], bias[2];
  for (int t : {1, 2}) {
    with_threads(t, [&] {
      SwigluCase sc(130, 600);  // three column blocks
      sc.loss();
      a[t - 1] = sc.a;
      bias[t - 1].assign(2 * sc.c, 0.0f);
      d_h[t - 1] = sc.backward(bias[t - 1].data());
      EXPECT_EQ(sc.backward(), d_h[t - 1]);
    });
  }
  EXPECT_EQ(a[0], a[1]);
  EXPECT_EQ(d_h[0], d_h[1]);
  EXPECT_EQ(bias[0], bias[1]);
}

// ------------------------------------------------------------ GELU (tanh form)

double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// y and gelu' against the closed form in double: 1e-6 absolute for values
// up to 1, relative beyond, as the erf form's test. Far out, exactly x (or 0)
// and 1 (or 0).
TEST(GeluTanh, ForwardAndDerivativeMatchTheClosedForm) {
  std::vector<float> x(16001), y(x.size()), dydx(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -8.0f + 0.001f * static_cast<float>(i);
  const auto n = static_cast<std::int64_t>(x.size());
  gelu_forward(x.data(), y.data(), dydx.data(), n, GeluForm::tanh);
  double worst_y = 0.0, worst_d = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double ry = gelu_tanh_ref(x[i]), rd = gelu_tanh_grad_ref(x[i]);
    worst_y = std::max(worst_y, std::fabs(y[i] - ry) / std::max(1.0, std::fabs(ry)));
    worst_d = std::max(worst_d, std::fabs(dydx[i] - rd) / std::max(1.0, std::fabs(rd)));
  }
  EXPECT_LE(worst_y, 1e-6);
  EXPECT_LE(worst_d, 1e-6);
  // Without the derivative, y is the same; with it written over x, too.
  std::vector<float> y_only(x.size()), z = x, y2(x.size());
  gelu_forward(x.data(), y_only.data(), nullptr, n, GeluForm::tanh);
  gelu_forward(z.data(), y2.data(), z.data(), n, GeluForm::tanh);
  EXPECT_EQ(y_only, y);
  EXPECT_EQ(y2, y);
  EXPECT_EQ(z, dydx);
  // It is not the erf form (they differ by up to ~5e-4).
  std::vector<float> y_erf(x.size());
  gelu_forward(x.data(), y_erf.data(), nullptr, n, GeluForm::erf);
  EXPECT_NE(y_erf, y);
  const std::vector<float> far = {30.0f, -30.0f, 1e6f, -1e6f};
  std::vector<float> fy(far.size()), fd(far.size());
  gelu_forward(far.data(), fy.data(), fd.data(), 4, GeluForm::tanh);
  EXPECT_EQ(fy, (std::vector<float>{30.0f, 0.0f, 1e6f, 0.0f}));
  EXPECT_EQ(fd, (std::vector<float>{1.0f, 0.0f, 1.0f, 0.0f}));
}

TEST(GeluTanh, DerivativeMatchesFiniteDifferences) {
  constexpr std::int64_t n = 64;
  std::mt19937 rng(151);
  std::vector<float> x = random_normal(rng, n, 2.0f), r = random_normal(rng, n), y(n), dydx(n), dx(n);
  gelu_forward(x.data(), y.data(), dydx.data(), n, GeluForm::tanh);
  gelu_backward(r.data(), dydx.data(), dx.data(), nullptr, 1, n);
  auto loss = [&] {
    gelu_forward(x.data(), y.data(), nullptr, n, GeluForm::tanh);
    return dot(y.data(), r.data(), n);
  };
  check_gradient("dx", x.data(), dx.data(), n, loss, kFd, rng);
}

template <class F>
void expect_gelu_tanh_rounds_once() {
  std::mt19937 rng(152);
  const auto x = narrow<F>(random_normal(rng, 1000, 3.0f));
  const std::vector<float> x32 = widen<F>(x);
  std::vector<typename F::T> y(x.size()), d(x.size());
  std::vector<float> y32(x.size()), d32(x.size());
  gelu_forward<F>(x.data(), y.data(), d.data(), 1000, GeluForm::tanh);
  gelu_forward(x32.data(), y32.data(), d32.data(), 1000, GeluForm::tanh);
  EXPECT_EQ(y, narrow<F>(y32));
  EXPECT_EQ(d, narrow<F>(d32));
}

TEST(GeluTanh, SixteenBitStorageRoundsTheF32ResultOnce) {
  expect_gelu_tanh_rounds_once<Bf16Format>();
  expect_gelu_tanh_rounds_once<F16Format>();
}

}  // namespace
}  // namespace dtrain::nn
