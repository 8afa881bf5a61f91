// Finite-difference gradient checks shared by the nn/ unit tests.
//
// A layer is checked through a scalar loss L(x) computed in double (usually
// L = sum(out * R) with R fixed, so the analytic backward runs with dy = R).
// For a float input x the check compares the analytic gradient to central
// differences (L(x + h) - L(x - h)) / (x+h - (x-h)), dividing by the step
// actually taken after rounding x +- h to float. Two views:
//   - per element: a random sample of elements, one at a time;
//   - directional: along a random direction u, against sum(grad * u), which
//     covers every element at once (a wrong element shows up with weight u_i).
// Pass criterion: |fd - analytic| <= rel * |analytic| + abs. The relative part
// covers the truncation error (O(h^2 f''') of central differences); the
// absolute floor covers the float noise of the forward pass, roughly
// eps_f32 * |terms of L| / h, which each test sizes for its own loss.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace dtrain::nn::testing {

struct FdTolerance {
  double h = 1e-2;      // step
  double rel = 2e-3;    // relative to |analytic|
  double abs = 1e-4;    // absolute floor (float noise of the forward / h)
  int samples = 20;     // elements checked one at a time (all when fewer)
};

inline std::vector<float> random_normal(std::mt19937& rng, std::size_t n, float stddev = 1.0f,
                                        float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline double dot(const float* a, const float* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Elements to check one at a time: all of them when n <= samples, else a
// random sample without repetition.
inline std::vector<std::int64_t> sample_indices(std::mt19937& rng, std::int64_t n, int samples) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = i;
  if (n > samples) {
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(static_cast<std::size_t>(samples));
  }
  return idx;
}

// Central difference of loss() w.r.t. x[i], restoring x[i] afterwards.
inline double fd_element(float* x, std::int64_t i, double h, const std::function<double()>& loss) {
  const float orig = x[i];
  const float plus = static_cast<float>(orig + h);
  const float minus = static_cast<float>(orig - h);
  x[i] = plus;
  const double lp = loss();
  x[i] = minus;
  const double lm = loss();
  x[i] = orig;
  return (lp - lm) / (static_cast<double>(plus) - static_cast<double>(minus));
}

// Checks analytic[0, n) = dL/dx by per-element and directional differences.
// loss() must recompute L from the current contents of x.
inline void check_gradient(const std::string& name, float* x, const float* analytic,
                           std::int64_t n, const std::function<double()>& loss,
                           const FdTolerance& tol, std::mt19937& rng) {
  SCOPED_TRACE(name);
  for (std::int64_t i : sample_indices(rng, n, tol.samples)) {
    const double fd = fd_element(x, i, tol.h, loss);
    const double an = analytic[i];
    EXPECT_NEAR(an, fd, tol.rel * std::fabs(an) + tol.abs) << name << "[" << i << "]";
  }
  // Directional: u ~ N(0, 1) per element; x +- h u moves every element by ~h.
  const std::vector<float> u = random_normal(rng, static_cast<std::size_t>(n));
  const std::vector<float> orig(x, x + n);
  std::vector<double> step(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(orig[i] + tol.h * u[i]);
  const double lp = loss();
  for (std::int64_t i = 0; i < n; ++i) {
    const float minus = static_cast<float>(orig[i] - tol.h * u[i]);
    step[static_cast<std::size_t>(i)] = static_cast<double>(x[i]) - minus;
    x[i] = minus;
  }
  const double lm = loss();
  std::copy(orig.begin(), orig.end(), x);
  // The step actually taken, divided by 2h, is the direction the difference measures.
  double an = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    an += static_cast<double>(analytic[i]) * step[static_cast<std::size_t>(i)] / (2.0 * tol.h);
  }
  const double fd = (lp - lm) / (2.0 * tol.h);
  // The floor grows with sqrt(n): every element moves at once, so the terms of
  // order h^2 that central differences leave out add up over the coordinates.
  const double floor = tol.abs * std::sqrt(static_cast<double>(n));
  EXPECT_NEAR(an, fd, tol.rel * std::fabs(an) + floor) << name << " along a random direction";
}

}  // namespace dtrain::nn::testing
