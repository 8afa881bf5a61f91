// The elementwise and row-wise layers of nn/ against double-precision
// references, and their backward passes against finite differences of
// L = sum(out * R) (R fixed; the analytic backward runs with dy = R).
//
// FD tolerances (see unit/gradient_check.h): h = 1e-2 on inputs of scale ~1;
// rel 2e-3 covers the O(h^2) truncation of central differences for these
// smooth layers (~1e-4 relative here); the absolute floor 1e-4 covers the
// f32 noise of the forward, ~sqrt(outputs touched) * 1e-7 * |y R| / (2h)
// ~ 3e-5. Forward tolerances are stated at each comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/cross_entropy.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/gelu.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "unit/gradient_check.h"

namespace dtrain::nn {
namespace {

using testing::check_gradient;
using testing::dot;
using testing::FdTolerance;
using testing::random_normal;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------- LayerNorm

struct LayerNormCase {
  static constexpr std::int64_t n = 6, c = 10;
  std::mt19937 rng{11};
  std::vector<float> x = random_normal(rng, n * c, 2.0f, 0.5f);
  std::vector<float> w = random_normal(rng, c, 0.5f, 1.0f);
  std::vector<float> b = random_normal(rng, c, 0.5f);
  std::vector<float> r = random_normal(rng, n * c);
  std::vector<float> y = std::vector<float>(n * c), mean = std::vector<float>(n),
                     rstd = std::vector<float>(n);

  double loss() {
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), n, c);
    return dot(y.data(), r.data(), n * c);
  }

  struct Gradients {
    std::vector<float> dx, dw, db;
  };
  // Every element of dx set to dx_fill, of dw to dw_fill, of db to db_fill.
  static Gradients filled(float dx_fill, float dw_fill = 0.0f, float db_fill = 0.0f) {
    return {std::vector<float>(n * c, dx_fill), std::vector<float>(c, dw_fill), std::vector<float>(c, db_fill)};
  }

  // Backward of loss(), after a call of it, into g; dx_sums as layernorm_backward takes it.
  Gradients backward(Gradients g, bool accumulate_dx, float* dx_sums = nullptr) {
    layernorm_backward(r.data(), x.data(), w.data(), mean.data(), rstd.data(), g.dx.data(), g.dw.data(),
                       g.db.data(), n, c, accumulate_dx, dx_sums);
    return g;
  }
};

// Mean and biased variance of row i of a [rows, c] matrix, in double.
std::pair<double, double> row_moments(const std::vector<float>& v, std::int64_t i, std::int64_t c) {
  double m = 0.0, sq = 0.0;
  for (std::int64_t j = 0; j < c; ++j) m += v[i * c + j];
  m /= c;
  for (std::int64_t j = 0; j < c; ++j) sq += std::pow(v[i * c + j] - m, 2);
  return {m, sq / c};
}

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  LayerNormCase lc;
  lc.loss();
  for (std::int64_t i = 0; i < lc.n; ++i) {
    const auto [m, var] = row_moments(lc.x, i, lc.c);
    const double rs = 1.0 / std::sqrt(var + kLayerNormEps);
    EXPECT_NEAR(lc.mean[i], m, 1e-6);              // |x| ~ 2: a few ulp
    EXPECT_NEAR(lc.rstd[i], rs, 1e-6 * rs);        // relative
    for (std::int64_t j = 0; j < lc.c; ++j) {
      const double ref = (lc.x[i * lc.c + j] - m) * rs * lc.w[j] + lc.b[j];
      EXPECT_NEAR(lc.y[i * lc.c + j], ref, 1e-5) << i << "," << j;  // |y| <~ 5: ~10 ulp
    }
  }
}

// The graph has the norm copy the residual stream it reads into the buffer
// the next GEMM adds its branch into; asking for the copy changes nothing else.
TEST(LayerNorm, CopiesTheResidualStreamInTheSamePass) {
  LayerNormCase lc;
  lc.loss();
  std::vector<float> y(lc.y.size()), mean(lc.mean.size()), rstd(lc.rstd.size()), copy(lc.x.size(), -1.0f);
  layernorm_forward(lc.x.data(), lc.w.data(), lc.b.data(), y.data(), mean.data(), rstd.data(), lc.n, lc.c,
                    copy.data());
  EXPECT_EQ(copy, lc.x);
  EXPECT_EQ(y, lc.y);
  EXPECT_EQ(mean, lc.mean);
  EXPECT_EQ(rstd, lc.rstd);
}

TEST(LayerNorm, NormalisesToZeroMeanUnitVarianceBeforeAffine) {
  LayerNormCase lc;
  std::fill(lc.w.begin(), lc.w.end(), 1.0f);
  std::fill(lc.b.begin(), lc.b.end(), 0.0f);
  lc.loss();
  for (std::int64_t i = 0; i < lc.n; ++i) {
    const auto [m, var] = row_moments(lc.y, i, lc.c);
    EXPECT_NEAR(m, 0.0, 1e-6);
    // Biased variance var / (var + eps): within 1e-4 of 1 for var(x) ~ 4 (eps/var ~ 3e-6).
    EXPECT_NEAR(var, 1.0, 1e-4);
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  LayerNormCase lc;
  lc.loss();
  auto g = lc.backward(LayerNormCase::filled(0.0f), false);
  const FdTolerance tol{1e-2, 2e-3, 1e-4, 20};
  std::mt19937 rng(5);
  auto loss = [&] { return lc.loss(); };
  check_gradient("dx", lc.x.data(), g.dx.data(), lc.n * lc.c, loss, tol, rng);
  check_gradient("dweight", lc.w.data(), g.dw.data(), lc.c, loss, tol, rng);
  check_gradient("dbias", lc.b.data(), g.db.data(), lc.c, loss, tol, rng);
}

TEST(LayerNorm, BackwardAccumulatesIntoExistingGradients) {
  LayerNormCase lc;
  lc.loss();
  const auto g = lc.backward(LayerNormCase::filled(0.0f), false);
  // accumulate_dx: dx, dweight and dbias all add to what is there. 1e-6: the
  // compiler may fuse the add into an FMA, rounding once instead of twice.
  const auto added = lc.backward(LayerNormCase::filled(0.5f, 0.25f, -0.75f), true);
  for (std::size_t i = 0; i < g.dx.size(); ++i) EXPECT_NEAR(added.dx[i], 0.5f + g.dx[i], 1e-6);
  for (std::int64_t j = 0; j < lc.c; ++j) {
    EXPECT_NEAR(added.dw[j], 0.25f + g.dw[j], 1e-6);
    EXPECT_NEAR(added.db[j], -0.75f + g.db[j], 1e-6);
  }
  // Without accumulate_dx, dx is overwritten (garbage before is ignored).
  // Not bitwise: the vectorised body and the scalar tail round differently and
  // where the split falls depends on the address of dx.
  const auto over = lc.backward(LayerNormCase::filled(kNaN), false);
  for (std::size_t i = 0; i < g.dx.size(); ++i) EXPECT_NEAR(over.dx[i], g.dx[i], 1e-6);
}

// dx_sums: the column sums of dx as the pass leaves it, bit for bit the sum
// linear_backward would take of it (rows in order from 0), written over any
// garbage; with and without accumulate_dx. The rest is as without dx_sums.
TEST(LayerNorm, BackwardSumsTheColumnsOfDxInTheSamePass) {
  LayerNormCase lc;
  lc.loss();
  for (const bool accumulate : {false, true}) {
    const auto g = lc.backward(LayerNormCase::filled(0.5f), accumulate);
    std::vector<float> sums(lc.c, kNaN);
    const auto summed = lc.backward(LayerNormCase::filled(0.5f), accumulate, sums.data());
    for (std::size_t i = 0; i < g.dx.size(); ++i) {
      EXPECT_NEAR(summed.dx[i], g.dx[i], 1e-6);  // the split of body and tail may move
    }
    EXPECT_EQ(summed.dw, g.dw);
    EXPECT_EQ(summed.db, g.db);
    std::vector<float> expected(lc.c, 0.0f);
    for (std::int64_t i = 0; i < lc.n; ++i) {
      for (std::int64_t j = 0; j < lc.c; ++j) expected[j] += summed.dx[i * lc.c + j];
    }
    EXPECT_EQ(sums, expected) << "accumulate_dx = " << accumulate;
  }
}

// ------------------------------------------------------------------- Linear

struct LinearCase {
  static constexpr std::int64_t n = 5, in = 7, out = 6;
  std::mt19937 rng{21};
  std::vector<float> x = random_normal(rng, n * in);
  std::vector<float> w = random_normal(rng, out * in, 0.5f);
  std::vector<float> b = random_normal(rng, out);
  std::vector<float> r = random_normal(rng, n * out);
  std::vector<float> y = std::vector<float>(n * out);

  double loss() {
    linear_forward(x.data(), w.data(), b.data(), y.data(), n, in, out);
    return dot(y.data(), r.data(), n * out);
  }
  // Reference y[i, o] and the magnitude it was summed from (for the tolerance).
  double ref(std::int64_t i, std::int64_t o, bool bias, double* mag) const {
    double s = bias ? b[o] : 0.0;
    *mag = bias ? std::fabs(b[o]) : 0.0;
    for (std::int64_t k = 0; k < in; ++k) {
      s += static_cast<double>(x[i * in + k]) * w[o * in + k];
      *mag += std::fabs(static_cast<double>(x[i * in + k]) * w[o * in + k]);
    }
    return s;
  }
};

// fp32 accumulation of k terms: |y - ref| <= 1e-5 * sum |terms| (as test_matmul).
TEST(Linear, ForwardMatchesNaiveDoubleMatmul) {
  LinearCase lc;
  lc.loss();
  std::vector<float> y_nobias(lc.n * lc.out), y_acc(lc.n * lc.out, 2.0f);
  linear_forward(lc.x.data(), lc.w.data(), nullptr, y_nobias.data(), lc.n, lc.in, lc.out);
  linear_forward(lc.x.data(), lc.w.data(), lc.b.data(), y_acc.data(), lc.n, lc.in, lc.out, true);
  for (std::int64_t i = 0; i < lc.n; ++i) {
    for (std::int64_t o = 0; o < lc.out; ++o) {
      double mag = 0.0;
      const double with_b = lc.ref(i, o, true, &mag);
      EXPECT_NEAR(lc.y[i * lc.out + o], with_b, 1e-5 * mag);
      EXPECT_NEAR(y_acc[i * lc.out + o], 2.0 + with_b, 1e-5 * (mag + 2.0)) << "accumulate";
      const double no_b = lc.ref(i, o, false, &mag);
      EXPECT_NEAR(y_nobias[i * lc.out + o], no_b, 1e-5 * mag) << "no bias";
    }
  }
}

// Linear in every input, so central differences are exact up to f32 noise.
TEST(Linear, BackwardMatchesFiniteDifferences) {
  LinearCase lc;
  std::vector<float> dx(lc.n * lc.in), dw(lc.out * lc.in, 0.0f), db(lc.out, 0.0f);
  linear_backward(lc.r.data(), lc.x.data(), lc.w.data(), dx.data(), dw.data(), db.data(), lc.n,
                  lc.in, lc.out);
  const FdTolerance tol{1e-2, 2e-3, 1e-4, 20};
  std::mt19937 rng(6);
  auto loss = [&] { return lc.loss(); };
  check_gradient("dx", lc.x.data(), dx.data(), lc.n * lc.in, loss, tol, rng);
  check_gradient("dweight", lc.w.data(), dw.data(), lc.out * lc.in, loss, tol, rng);
  check_gradient("dbias", lc.b.data(), db.data(), lc.out, loss, tol, rng);
}

TEST(Linear, BackwardAccumulatesAndSkipsNullDx) {
  LinearCase lc;
  const std::size_t nx = lc.n * lc.in, nw = lc.out * lc.in;
  std::vector<float> dx(nx), dw(nw, 0.0f), db(lc.out, 0.0f);
  linear_backward(lc.r.data(), lc.x.data(), lc.w.data(), dx.data(), dw.data(), db.data(), lc.n,
                  lc.in, lc.out);
  // accumulate_dx adds; dweight and dbias always add. 1e-6 covers a GEMM that
  // sums C + AB in another order than the test's fl(C + fl(AB)).
  std::vector<float> dx2(nx, 0.5f), dw2(nw, 0.25f), db2(lc.out, -1.0f);
  linear_backward(lc.r.data(), lc.x.data(), lc.w.data(), dx2.data(), dw2.data(), db2.data(), lc.n,
                  lc.in, lc.out, true);
  for (std::size_t i = 0; i < nx; ++i) EXPECT_NEAR(dx2[i], 0.5f + dx[i], 1e-6);
  for (std::size_t i = 0; i < nw; ++i) EXPECT_NEAR(dw2[i], 0.25f + dw[i], 1e-6);
  for (std::int64_t o = 0; o < lc.out; ++o) EXPECT_NEAR(db2[o], -1.0f + db[o], 1e-6);
  // Null dx (the first layer) and null dbias: the weight gradient is unchanged.
  std::vector<float> dw3(nw, 0.0f);
  linear_backward(lc.r.data(), lc.x.data(), lc.w.data(), nullptr, dw3.data(), nullptr, lc.n,
                  lc.in, lc.out);
  for (std::size_t i = 0; i < nw; ++i) EXPECT_EQ(dw3[i], dw[i]);
  // Without accumulate_dx, dx is overwritten.
  std::vector<float> dx4(nx, kNaN), dw4(nw, 0.0f);
  linear_backward(lc.r.data(), lc.x.data(), lc.w.data(), dx4.data(), dw4.data(), nullptr, lc.n,
                  lc.in, lc.out);
  for (std::size_t i = 0; i < nx; ++i) EXPECT_EQ(dx4[i], dx[i]);
}

// Rows further apart than their width (LinearRows: the d_ff-wide activations
// where the CPU pads them): x and dx rows `in + 3` apart, y and dy `out + 5`.
// Every product and the bias gradient read the same numbers as dense rows
// (1e-6 of the values: a dense product may run another kernel), and the
// padding columns are neither read (they hold NaN) nor written.
TEST(Linear, StridedRowsGiveTheDenseRowsResults) {
  LinearCase lc;
  constexpr std::int64_t n = LinearCase::n, in = LinearCase::in, out = LinearCase::out;
  const LinearRows rows{.in = in + 3, .out = out + 5};
  auto strided = [](const std::vector<float>& dense, std::int64_t width, std::int64_t ld) {
    std::vector<float> v(static_cast<std::size_t>(n * ld), kNaN);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < width; ++j) v[i * ld + j] = dense[i * width + j];
    }
    return v;
  };
  auto expect_rows = [](const std::vector<float>& got, const std::vector<float>& dense, std::int64_t width,
                        std::int64_t ld, const char* what) {
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < width; ++j) {
        const float want = dense[i * width + j];
        EXPECT_NEAR(got[i * ld + j], want, 1e-6f * (1.0f + std::fabs(want))) << what << " " << i << "," << j;
      }
      for (std::int64_t j = width; j < ld; ++j) EXPECT_TRUE(std::isnan(got[i * ld + j])) << what << " padding";
    }
  };
  lc.loss();  // lc.y: the dense forward
  const std::vector<float> xs = strided(lc.x, in, rows.in), rs = strided(lc.r, out, rows.out);
  std::vector<float> ys = strided(std::vector<float>(n * out, kNaN), out, rows.out);
  linear_forward(xs.data(), lc.w.data(), lc.b.data(), ys.data(), n, in, out, false, 0, rows);
  expect_rows(ys, lc.y, out, rows.out, "y");

  std::vector<float> dx(n * in), dw(out * in, 0.0f), db(out, 0.0f);
  linear_backward(lc.r.data(), lc.x.data(), lc.w.data(), dx.data(), dw.data(), db.data(), n, in, out);
  std::vector<float> dxs(static_cast<std::size_t>(n * rows.in), kNaN), dws(out * in, 0.0f), dbs(out, 0.0f);
  linear_backward(rs.data(), xs.data(), lc.w.data(), dxs.data(), dws.data(), dbs.data(), n, in, out, false, nullptr,
                  0, rows);
  expect_rows(dxs, dx, in, rows.in, "dx");
  for (std::int64_t i = 0; i < out * in; ++i) EXPECT_NEAR(dws[i], dw[i], 1e-6f * (1.0f + std::fabs(dw[i]))) << i;
  EXPECT_EQ(dbs, db);  // the same sums in the same order
}

// --------------------------------------------------------------------- GELU

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// 1e-6 absolute for |y| <= 1, relative beyond (an ulp of 8 is already 9.5e-7):
// fast_erf's 4e-7 times 0.5|x| plus the rounding of y.
TEST(Gelu, ForwardMatchesErfFormula) {
  std::vector<float> x(16001), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -8.0f + 0.001f * static_cast<float>(i);
  gelu_forward(x.data(), y.data(), nullptr, static_cast<std::int64_t>(x.size()));
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::fabs(y[i] - gelu_ref(x[i])) /
                                std::max(1.0, std::fabs(gelu_ref(x[i]))));
  }
  EXPECT_LE(worst, 1e-6);
  // Asking for the derivative too (written over x) leaves y as it was.
  std::vector<float> z = x, y2(x.size());
  gelu_forward(z.data(), y2.data(), z.data(), static_cast<std::int64_t>(z.size()));
  EXPECT_EQ(y2, y);
}

// gelu'(x) = Phi(x) + x phi(x) in double; 1e-6 absolute as the forward.
TEST(Gelu, DerivativeMatchesClosedForm) {
  std::vector<float> x(16001), y(x.size()), dydx(x.size()), ones(x.size(), 1.0f), dx(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -8.0f + 0.001f * static_cast<float>(i);
  gelu_forward(x.data(), y.data(), dydx.data(), static_cast<std::int64_t>(x.size()));
  gelu_backward(ones.data(), dydx.data(), dx.data(), nullptr, 1, static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); i += 7) {
    const double v = x[i];
    const double ref = 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) +
                       v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    EXPECT_NEAR(dx[i], ref, 1e-6) << "x = " << v;
  }
}

// gelu.cpp is built assuming finite values (nn/CMakeLists.txt), yet an
// overflow upstream must still reach the loss: inf and NaN in, no finite y
// out (gelu' of +-inf may come out finite: the loss is already non-finite
// then, and so is every gradient). Far from 0, finite inputs still follow
// gelu (x, or 0 below). Both forms.
TEST(Gelu, NonFiniteInputsGiveNonFiniteOutputs) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {inf, -inf, kNaN, -kNaN, 1e30f, -1e30f, 40.0f, -40.0f};
  for (const GeluForm form : {GeluForm::erf, GeluForm::tanh}) {
    SCOPED_TRACE(form == GeluForm::erf ? "erf" : "tanh");
    std::vector<float> y(x.size()), y_only(x.size()), dydx(x.size());
    const auto n = static_cast<std::int64_t>(x.size());
    gelu_forward(x.data(), y.data(), dydx.data(), n, form);
    gelu_forward(x.data(), y_only.data(), nullptr, n, form);
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_FALSE(std::isfinite(y[i])) << "x = " << x[i];
      EXPECT_FALSE(std::isfinite(y_only[i])) << "x = " << x[i];
    }
    EXPECT_FALSE(std::isfinite(dydx[2]));
    EXPECT_FALSE(std::isfinite(dydx[3]));
    EXPECT_EQ(y[4], 1e30f);
    EXPECT_EQ(y[5], 0.0f);
    EXPECT_EQ(y[6], 40.0f);
    EXPECT_EQ(y[7], 0.0f);
    EXPECT_EQ(dydx[6], 1.0f);
    EXPECT_EQ(dydx[7], 0.0f);
    EXPECT_EQ(y_only[4], 1e30f);
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  constexpr std::int64_t n = 64;
  std::mt19937 rng(31);
  std::vector<float> x = random_normal(rng, n, 2.0f), r = random_normal(rng, n), y(n), dx(n);
  auto loss = [&] {
    gelu_forward(x.data(), y.data(), nullptr, n);
    return dot(y.data(), r.data(), n);
  };
  std::vector<float> dydx(n);
  gelu_forward(x.data(), y.data(), dydx.data(), n);
  gelu_backward(r.data(), dydx.data(), dx.data(), nullptr, 1, n);
  check_gradient("dx", x.data(), dx.data(), n, loss, FdTolerance{1e-2, 2e-3, 1e-4, 20}, rng);
  // dy and dx may alias.
  std::vector<float> g = r;
  gelu_backward(g.data(), dydx.data(), g.data(), nullptr, 1, n);
  EXPECT_EQ(g, dx);
}

// y = gelu(x + b), b broadcast over the rows (fc1's bias before the GELU):
// dbias, summed in the backward pass, against finite differences in b, and
// bit for bit the composition it replaces (dx, then its column sums in order).
TEST(Gelu, BackwardSumsTheBiasGradientInTheSamePass) {
  constexpr std::int64_t n = 12, c = 9;
  std::mt19937 rng(32);
  std::vector<float> x = random_normal(rng, n * c, 2.0f), b = random_normal(rng, c, 0.5f);
  std::vector<float> r = random_normal(rng, n * c), h(n * c), y(n * c), dydx(n * c), dx(n * c);
  auto preactivation = [&] {
    for (std::int64_t i = 0; i < n * c; ++i) h[i] = x[i] + b[i % c];
  };
  auto loss = [&] {
    preactivation();
    gelu_forward(h.data(), y.data(), nullptr, n * c);
    return dot(y.data(), r.data(), n * c);
  };
  preactivation();
  gelu_forward(h.data(), y.data(), dydx.data(), n * c);
  std::vector<float> db(c, 0.5f);
  gelu_backward(r.data(), dydx.data(), dx.data(), db.data(), n, c);
  std::vector<float> db_fd(c);
  for (std::int64_t j = 0; j < c; ++j) db_fd[j] = db[j] - 0.5f;
  check_gradient("dbias", b.data(), db_fd.data(), c, loss, FdTolerance{1e-2, 2e-3, 1e-4, 20}, rng);

  std::vector<float> dx_alone(n * c), db_alone(c, 0.5f);
  gelu_backward(r.data(), dydx.data(), dx_alone.data(), nullptr, n, c);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < c; ++j) db_alone[j] += dx_alone[i * c + j];
  }
  EXPECT_EQ(dx, dx_alone);
  EXPECT_EQ(db, db_alone);
}

// Rows ld apart (the CPU's padded d_ff-wide activations): the same dx and
// dbias as dense rows, bit for bit, and the padding columns untouched.
TEST(Gelu, BackwardWithRowsApartMatchesDenseRows) {
  constexpr std::int64_t n = 6, c = 9, ld = 16;
  std::mt19937 rng(33);
  const std::vector<float> dy = random_normal(rng, n * c), dydx = random_normal(rng, n * c);
  auto strided = [&](const std::vector<float>& dense) {
    std::vector<float> v(n * ld, kNaN);
    for (std::int64_t i = 0; i < n; ++i) std::copy_n(dense.begin() + i * c, c, v.begin() + i * ld);
    return v;
  };
  for (bool bias : {false, true}) {
    std::vector<float> dx(n * c), db(c, 0.25f), db_strided(c, 0.25f);
    gelu_backward(dy.data(), dydx.data(), dx.data(), bias ? db.data() : nullptr, n, c);
    std::vector<float> dxs = strided(dy);  // in place, as the graph runs it
    const std::vector<float> dydxs = strided(dydx);
    gelu_backward(dxs.data(), dydxs.data(), dxs.data(), bias ? db_strided.data() : nullptr, n, c, ld);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < c; ++j) EXPECT_EQ(dxs[i * ld + j], dx[i * c + j]) << i << "," << j;
      for (std::int64_t j = c; j < ld; ++j) EXPECT_TRUE(std::isnan(dxs[i * ld + j])) << "padding " << i << "," << j;
    }
    EXPECT_EQ(db_strided, db) << "bias " << bias;
  }
}

// ---------------------------------------------------------------- Embedding

TEST(TokenEmbedding, ForwardAddsTokenRowAndPosition) {
  constexpr std::int64_t B = 2, T = 3, d = 4, V = 5, max_seq = 4;
  std::mt19937 rng(41);
  const std::vector<float> table = random_normal(rng, V * d), pos = random_normal(rng, max_seq * d);
  const std::vector<std::int32_t> tokens{4, 0, 4, 2, 2, 1};
  std::vector<float> out(B * T * d);
  token_embedding_forward(tokens.data(), table.data(), pos.data(), out.data(), B, T, d, V);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t j = 0; j < d; ++j) {
        const float expect = table[tokens[b * T + t] * d + j] + pos[t * d + j];
        EXPECT_EQ(out[(b * T + t) * d + j], expect) << b << "," << t << "," << j;
      }
    }
  }
}

// Repeated tokens add up in their row; rows of unused tokens and positions
// beyond T keep the value they had.
TEST(TokenEmbedding, BackwardScatterAddsIncludingRepeatedTokens) {
  constexpr std::int64_t B = 2, T = 3, d = 4, V = 5, max_seq = 4;
  std::mt19937 rng(42);
  const std::vector<std::int32_t> tokens{4, 0, 4, 2, 4, 0};  // token 4 three times, 3 never
  const std::vector<float> g = random_normal(rng, B * T * d);
  std::vector<float> d_table(V * d, 0.5f), d_pos(max_seq * d, -0.25f);
  token_embedding_backward(tokens.data(), g.data(), d_table.data(), d_pos.data(), B, T, d);
  std::vector<double> ref_table(V * d, 0.5), ref_pos(max_seq * d, -0.25);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t j = 0; j < d; ++j) {
        ref_table[tokens[b * T + t] * d + j] += g[(b * T + t) * d + j];
        ref_pos[t * d + j] += g[(b * T + t) * d + j];
      }
    }
  }
  for (std::size_t i = 0; i < d_table.size(); ++i) EXPECT_NEAR(d_table[i], ref_table[i], 1e-6);
  for (std::size_t i = 0; i < d_pos.size(); ++i) EXPECT_NEAR(d_pos[i], ref_pos[i], 1e-6);
  for (std::int64_t j = 0; j < d; ++j) {
    EXPECT_EQ(d_table[3 * d + j], 0.5f) << "unused token row";
    EXPECT_EQ(d_pos[3 * d + j], -0.25f) << "position beyond T";
  }
}

TEST(TokenEmbedding, OutOfRangeTokenThrowsNamingIt) {
  constexpr std::int64_t B = 1, T = 3, d = 2, V = 5;
  const std::vector<float> table(V * d, 0.0f), pos(T * d, 0.0f);
  std::vector<float> out(B * T * d);
  for (std::int32_t bad : {5, 77, -1}) {
    const std::vector<std::int32_t> tokens{1, bad, 2};
    try {
      token_embedding_forward(tokens.data(), table.data(), pos.data(), out.data(), B, T, d, V);
      ADD_FAILURE() << "token " << bad << " did not throw";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("token " + std::to_string(bad)), std::string::npos) << what;
      EXPECT_NE(what.find("position 1"), std::string::npos) << what;
    }
  }
}

struct PatchCase {
  static constexpr std::int64_t B = 2, T = 3, d = 5, P = 4;
  std::mt19937 rng{51};
  std::vector<float> patches = random_normal(rng, B * T * P);
  std::vector<float> w = random_normal(rng, d * P, 0.5f);
  std::vector<float> b = random_normal(rng, d);
  std::vector<float> pos = random_normal(rng, T * d);
  std::vector<float> r = random_normal(rng, B * T * d);
  std::vector<float> out = std::vector<float>(B * T * d);
  double loss() {
    patch_embedding_forward(patches.data(), w.data(), b.data(), pos.data(), out.data(), B, T, d, P);
    return dot(out.data(), r.data(), B * T * d);
  }
};

TEST(PatchEmbedding, ForwardIsLinearProjectionPlusPosition) {
  PatchCase pc;
  pc.loss();
  for (std::int64_t bt = 0; bt < pc.B * pc.T; ++bt) {
    const std::int64_t t = bt % pc.T;
    for (std::int64_t j = 0; j < pc.d; ++j) {
      double ref = pc.b[j] + pc.pos[t * pc.d + j], mag = std::fabs(ref);
      for (std::int64_t k = 0; k < pc.P; ++k) {
        ref += static_cast<double>(pc.patches[bt * pc.P + k]) * pc.w[j * pc.P + k];
        mag += std::fabs(static_cast<double>(pc.patches[bt * pc.P + k]) * pc.w[j * pc.P + k]);
      }
      EXPECT_NEAR(pc.out[bt * pc.d + j], ref, 1e-5 * mag);
    }
  }
}

TEST(PatchEmbedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  PatchCase pc;
  std::vector<float> dw(pc.d * pc.P, 0.0f), db(pc.d, 0.0f), dpos(pc.T * pc.d, 0.0f);
  patch_embedding_backward(pc.patches.data(), pc.r.data(), dw.data(), db.data(), dpos.data(), pc.B,
                           pc.T, pc.d, pc.P);
  std::mt19937 rng(7);
  auto loss = [&] { return pc.loss(); };
  const FdTolerance tol{1e-2, 2e-3, 1e-4, 20};
  check_gradient("d_weight", pc.w.data(), dw.data(), pc.d * pc.P, loss, tol, rng);
  check_gradient("d_bias", pc.b.data(), db.data(), pc.d, loss, tol, rng);
  check_gradient("d_pos", pc.pos.data(), dpos.data(), pc.T * pc.d, loss, tol, rng);
  // All three gradients are added to what is there.
  std::vector<float> dw2(dw.size(), 0.5f), db2(db.size(), 0.5f), dpos2(dpos.size(), 0.5f);
  patch_embedding_backward(pc.patches.data(), pc.r.data(), dw2.data(), db2.data(), dpos2.data(),
                           pc.B, pc.T, pc.d, pc.P);
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 0.5f + dw[i], 1e-6);
  for (std::size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(db2[i], 0.5f + db[i], 1e-6);
  for (std::size_t i = 0; i < dpos.size(); ++i) EXPECT_NEAR(dpos2[i], 0.5f + dpos[i], 1e-6);
}

TEST(MeanPool, ForwardAveragesAndBackwardWritesSpreadGradient) {
  constexpr std::int64_t B = 2, T = 3, d = 4;
  std::mt19937 rng(61);
  std::vector<float> x = random_normal(rng, B * T * d), r = random_normal(rng, B * d), out(B * d);
  mean_pool_forward(x.data(), out.data(), B, T, d);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t j = 0; j < d; ++j) {
      double m = 0.0;
      for (std::int64_t t = 0; t < T; ++t) m += x[(b * T + t) * d + j];
      EXPECT_NEAR(out[b * d + j], m / T, 1e-6);
    }
  }
  std::vector<float> dx(B * T * d, kNaN);  // written, not added to
  mean_pool_backward(r.data(), dx.data(), B, T, d);
  auto loss = [&] {
    mean_pool_forward(x.data(), out.data(), B, T, d);
    return dot(out.data(), r.data(), B * d);
  };
  check_gradient("d_x", x.data(), dx.data(), B * T * d, loss, FdTolerance{1e-2, 2e-3, 1e-4, 24},
                 rng);
}

// ------------------------------------------------------------ CrossEntropy

struct CeCase {
  static constexpr std::int64_t n = 6, v = 9;
  std::mt19937 rng{71};
  std::vector<float> logits = random_normal(rng, n * v, 3.0f);
  std::vector<std::int32_t> targets = std::vector<std::int32_t>(n);
  std::vector<float> probs = std::vector<float>(n * v);
  CeCase() {
    std::uniform_int_distribution<std::int32_t> pick(0, v - 1);
    for (std::int64_t i = 0; i < n; ++i) targets[i] = pick(rng);
    // Rows 0 and 3 are right: their target is the argmax.
    for (std::int64_t i : {0, 3}) {
      targets[i] = static_cast<std::int32_t>(
          std::max_element(logits.begin() + i * v, logits.begin() + (i + 1) * v) -
          (logits.begin() + i * v));
    }
  }
  CrossEntropyResult run() {
    return cross_entropy_forward(logits.data(), targets.data(), probs.data(), n, v);
  }
};

// loss vs double log-softmax: 1e-6 relative per row (logits ~ N(0, 9), f32
// logsumexp); probabilities within 1e-6 absolute (fast_exp is 2 ulp).
TEST(CrossEntropy, ForwardMatchesDoubleLogSoftmax) {
  CeCase cc;
  const CrossEntropyResult res = cc.run();
  double loss = 0.0;
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < cc.n; ++i) {
    const float* x = cc.logits.data() + i * cc.v;
    double mx = x[0], sum = 0.0;
    std::int64_t argmax = 0;
    for (std::int64_t j = 1; j < cc.v; ++j) {
      if (x[j] > mx) {
        mx = x[j];
        argmax = j;
      }
    }
    for (std::int64_t j = 0; j < cc.v; ++j) sum += std::exp(x[j] - mx);
    for (std::int64_t j = 0; j < cc.v; ++j) {
      EXPECT_NEAR(cc.probs[i * cc.v + j], std::exp(x[j] - mx) / sum, 1e-6);
    }
    loss += std::log(sum) + mx - x[cc.targets[i]];
    correct += argmax == cc.targets[i] ? 1 : 0;
  }
  EXPECT_NEAR(res.loss_sum, loss, 1e-6 * loss);
  EXPECT_EQ(res.correct, correct);
  EXPECT_GE(res.correct, 2);
  // probs may alias logits.
  std::vector<float> alias = cc.logits;
  const CrossEntropyResult res2 =
      cross_entropy_forward(alias.data(), cc.targets.data(), alias.data(), cc.n, cc.v);
  EXPECT_EQ(res2.loss_sum, res.loss_sum);
  EXPECT_EQ(alias, cc.probs);
}

// Gradient of the mean loss: backward with scale 1/n. Floor 2e-5: each row's
// loss is rounded in f32 (~5e-7 for losses ~5), / n / 2h ~ 5e-6.
TEST(CrossEntropy, BackwardMatchesFiniteDifferencesOfMeanLoss) {
  CeCase cc;
  cc.run();
  std::vector<float> grad = cc.probs;
  cross_entropy_backward(grad.data(), cc.targets.data(), cc.n, cc.v, 1.0f / cc.n);
  auto loss = [&] { return cc.run().loss_sum / cc.n; };
  std::mt19937 rng(8);
  check_gradient("d_logits", cc.logits.data(), grad.data(), cc.n * cc.v, loss,
                 FdTolerance{1e-2, 2e-3, 2e-5, 30}, rng);
  // Each row of the gradient sums to 0 (softmax minus one-hot).
  for (std::int64_t i = 0; i < cc.n; ++i) {
    double s = 0.0;
    for (std::int64_t j = 0; j < cc.v; ++j) s += grad[i * cc.v + j];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

TEST(CrossEntropy, BackwardAppliesScale) {
  CeCase cc;
  cc.run();
  std::vector<float> grad = cc.probs;
  cross_entropy_backward(grad.data(), cc.targets.data(), cc.n, cc.v, 0.3f);
  for (std::int64_t i = 0; i < cc.n; ++i) {
    for (std::int64_t j = 0; j < cc.v; ++j) {
      const float onehot = j == cc.targets[i] ? 1.0f : 0.0f;
      EXPECT_NEAR(grad[i * cc.v + j], (cc.probs[i * cc.v + j] - onehot) * 0.3f, 1e-7);
    }
  }
}

TEST(CrossEntropy, TargetOutsideRangeThrowsNamingTheRow) {
  CeCase cc;
  for (std::int32_t bad : {9, -1}) {
    cc.targets[2] = bad;
    try {
      cc.run();
      ADD_FAILURE() << "target " << bad << " did not throw";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("row 2"), std::string::npos) << what;
      EXPECT_NE(what.find("target " + std::to_string(bad)), std::string::npos) << what;
    }
  }
}

// ------------------------------------------------------------------ Dropout

TEST(Dropout, ZeroProbabilityIsIdentity) {
  std::mt19937 rng(81);
  std::vector<float> x = random_normal(rng, 1000);
  const std::vector<float> orig = x;
  dropout_apply(x.data(), 1000, 0.0f, dropout_key(1, 2, 3, 4));
  EXPECT_EQ(x, orig);
}

// n = 200000 with p = 0.5: the kept fraction has sd 0.0011, so +-0.01 is ~9 sd.
TEST(Dropout, HalfKeepsAboutHalfAndScalesByTwo) {
  constexpr std::int64_t n = 200000;
  std::mt19937 rng(82);
  const std::vector<float> orig = random_normal(rng, n);
  for (float p : {0.5f, 0.1f}) {
    std::vector<float> x = orig;
    dropout_apply(x.data(), n, p, dropout_key(7, 0, 0, 0));
    std::int64_t kept = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (x[i] == 0.0f) continue;
      ++kept;
      ASSERT_EQ(x[i], orig[i] * (1.0f / (1.0f - p))) << "p = " << p << ", i = " << i;
    }
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01) << "p = " << p;
  }
}

// The mask depends on the key only (not on the values), so backward can
// recompute it; another key gives another mask.
TEST(Dropout, SameKeySameMaskDifferentKeyDifferentMask) {
  constexpr std::int64_t n = 10000;
  std::mt19937 rng(83);
  std::vector<float> a = random_normal(rng, n), b(n, 1.0f), c(n, 1.0f);
  const std::uint64_t key = dropout_key(5, 10, 1, 3);
  EXPECT_EQ(key, dropout_key(5, 10, 1, 3));
  dropout_apply(a.data(), n, 0.5f, key);
  dropout_apply(b.data(), n, 0.5f, key);
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i] == 0.0f, b[i] == 0.0f) << i;
  for (const std::uint64_t other :
       {dropout_key(6, 10, 1, 3), dropout_key(5, 11, 1, 3), dropout_key(5, 10, 2, 3),
        dropout_key(5, 10, 1, 4)}) {
    ASSERT_NE(other, key);
    std::fill(c.begin(), c.end(), 1.0f);
    dropout_apply(c.data(), n, 0.5f, other);
    differ = 0;
    for (std::int64_t i = 0; i < n; ++i) differ += (b[i] == 0.0f) != (c[i] == 0.0f) ? 1 : 0;
    // Independent masks disagree on half the elements (sd 0.005 of n).
    EXPECT_NEAR(static_cast<double>(differ) / n, 0.5, 0.03);
  }
}

}  // namespace
}  // namespace dtrain::nn
