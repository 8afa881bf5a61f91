#include "nn/layernorm.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "nn/cpu/convert.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {
template <class F>
void layernorm_forward(const float* x, const float* weight, const float* bias, typename F::T* y,
                       float* mean, float* rstd, std::int64_t n, std::int64_t c, float* x_copy, float eps) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    typename F::T* yi = y + i * c;
    cpu::LaneSums sum;
    sum.add(c, [&](auto at) { return at(xi); });
    const float m = sum.total() / static_cast<float>(c);
    cpu::LaneSums var;
    var.add(c, [&](auto at) {
      const auto d = at(xi) - m;
      return d * d;
    });
    const float s = 1.0f / std::sqrt(var.total() / static_cast<float>(c) + eps);
    for (std::int64_t j = 0; j < c; ++j) yi[j] = F::store((xi[j] - m) * s * weight[j] + bias[j]);
    if (x_copy != nullptr) std::memcpy(x_copy + i * c, xi, static_cast<std::size_t>(c) * sizeof(float));
    mean[i] = m;
    rstd[i] = s;
  }
}

#define DTRAIN_INSTANTIATE(F)                                                                    \
  template void layernorm_forward<F>(const float*, const float*, const float*, F::T*, float*, \
                                     float*, std::int64_t, std::int64_t, float*, float);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight += sum_rows dy * xhat,  dbias += sum_rows dy.
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, float* dx, float* dweight, float* dbias,
                        std::int64_t n, std::int64_t c, bool accumulate_dx, float* dx_sums) {
  const float inv_c = 1.0f / static_cast<float>(c);
  if (dx_sums != nullptr) std::memset(dx_sums, 0, static_cast<std::size_t>(c) * sizeof(float));
  for (std::int64_t i = 0; i < n; ++i) {
    const float* dyi = dy + i * c;
    const float* xi = x + i * c;
    float* dxi = dx + i * c;
    const float m = mean[i];
    const float s = rstd[i];
    cpu::LaneSums sum_g, sum_gx;
    cpu::add_pair(c, sum_g, sum_gx, [&](auto at) {
      const auto g = at(dyi) * at(weight);
      return std::pair{g, g * ((at(xi) - m) * s)};
    });
    for (std::int64_t j = 0; j < c; ++j) {
      dweight[j] += dyi[j] * ((xi[j] - m) * s);
      dbias[j] += dyi[j];
    }
    const float mean_g = sum_g.total() * inv_c;
    const float mean_gx = sum_gx.total() * inv_c;
    // One loop per case, each vectorised without a branch inside.
    auto write_dx = [&](auto accumulate, auto sums) {
      for (std::int64_t j = 0; j < c; ++j) {
        const float xhat = (xi[j] - m) * s;
        const float d = s * (dyi[j] * weight[j] - mean_g - xhat * mean_gx);
        const float out = accumulate ? dxi[j] + d : d;
        dxi[j] = out;
        if constexpr (sums) dx_sums[j] += out;
      }
    };
    if (dx_sums != nullptr) {
      accumulate_dx ? write_dx(std::true_type{}, std::true_type{}) : write_dx(std::false_type{}, std::true_type{});
    } else {
      accumulate_dx ? write_dx(std::true_type{}, std::false_type{}) : write_dx(std::false_type{}, std::false_type{});
    }
  }
}

}  // namespace dtrain::nn
