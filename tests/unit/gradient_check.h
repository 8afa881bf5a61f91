// Finite-difference gradient checks shared by the nn/ unit tests.
//
// A layer is checked through a scalar loss L(x) computed in double (usually
// L = sum(out * R) with R fixed, so the analytic backward runs with dy = R).
// For a float input x the check compares the analytic gradient to central
// differences of L, in two views:
//   - per element: a random sample of elements, one at a time;
//   - directional: along a random unit vector u, against sum(grad * u), which
//     covers every element at once (a wrong element shows up with weight u_i).
// Pass criterion: |fd - analytic| <= rel * |analytic| + abs. The relative part
// covers the truncation error (O(h^2 f''') of central differences); the
// absolute floor covers the float noise of the forward pass, roughly
// eps_f32 * |terms of L| / h, which each test sizes for its own loss.
// For deep, curved losses whose value is itself only a float (the whole
// model), `fourth_order` uses the 4-point central stencil
// (8 (L(h) - L(-h)) - (L(2h) - L(-2h))) / 12h: truncation O(h^4), so h can
// stay large enough to keep the float noise small.
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
  double h = 1e-2;            // step
  double rel = 2e-3;          // relative to |analytic|
  double abs = 1e-4;          // absolute floor (float noise of the forward / h)
  int samples = 20;           // elements checked one at a time (all when fewer)
  bool fourth_order = false;  // 4-point stencil instead of 2-point
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

// dL along `dir` at x by central differences: L(x + t h dir) for t in
// {-1, 1} (and {-2, 2} with fourth_order); x is restored afterwards. The
// points are rounded to float, which moves a step by up to |x| * 6e-8: a
// relative error 6e-8 |x| / h <= 1.2e-5 for |x| <= 2, h >= 1e-2, well below
// the tolerances.
inline double fd_along(float* x, const float* dir, std::int64_t n, const FdTolerance& tol,
                       const std::function<double()>& loss) {
  const std::vector<float> orig(x, x + n);
  auto at = [&](double t) {
    for (std::int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(orig[static_cast<std::size_t>(i)] + t * tol.h * dir[i]);
    }
    return loss();
  };
  const double d1 = at(1.0) - at(-1.0);
  double fd = d1 / (2.0 * tol.h);
  if (tol.fourth_order) fd = (8.0 * d1 - (at(2.0) - at(-2.0))) / (12.0 * tol.h);
  std::copy(orig.begin(), orig.end(), x);
  return fd;
}

// Checks analytic[0, n) = dL/dx by per-element and directional differences.
// loss() must recompute L from the current contents of x.
inline void check_gradient(const std::string& name, float* x, const float* analytic,
                           std::int64_t n, const std::function<double()>& loss,
                           const FdTolerance& tol, std::mt19937& rng) {
  SCOPED_TRACE(name);
  const float unit = 1.0f;
  for (std::int64_t i : sample_indices(rng, n, tol.samples)) {
    const double fd = fd_along(x + i, &unit, 1, tol, loss);
    const double an = analytic[i];
    EXPECT_NEAR(an, fd, tol.rel * std::fabs(an) + tol.abs) << name << "[" << i << "]";
  }
  // Directional: a random unit vector u (so a step has length h, as for one
  // element, and the same tolerances apply), against sum(analytic * u).
  std::vector<float> u = random_normal(rng, static_cast<std::size_t>(n));
  const double norm = std::sqrt(dot(u.data(), u.data(), n));
  for (float& ui : u) ui = static_cast<float>(ui / norm);
  const double fd = fd_along(x, u.data(), n, tol, loss);
  const double an = dot(analytic, u.data(), n);
  EXPECT_NEAR(an, fd, tol.rel * std::fabs(an) + tol.abs) << name << " along a random direction";
}

}  // namespace dtrain::nn::testing
