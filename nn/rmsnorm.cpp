#include "nn/rmsnorm.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "nn/cpu/convert.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

// y = x * rstd * weight, in that order (Hugging Face's LlamaRMSNorm and
// torch.nn.RMSNorm normalise first, then scale).
template <class F>
void rmsnorm_forward(const float* x, const float* weight, typename F::T* y, float* rstd, std::int64_t n,
                     std::int64_t c, float eps, float* x_copy) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    typename F::T* yi = y + i * c;
    cpu::LaneSums squares;
    squares.add(c, [&](auto at) { return at(xi) * at(xi); });
    const float s = 1.0f / std::sqrt(squares.total() / static_cast<float>(c) + eps);
    for (std::int64_t j = 0; j < c; ++j) yi[j] = F::store(xi[j] * s * weight[j]);
    if (x_copy != nullptr) std::memcpy(x_copy + i * c, xi, static_cast<std::size_t>(c) * sizeof(float));
    rstd[i] = s;
  }
}

#define DTRAIN_INSTANTIATE(F)                                                                          \
  template void rmsnorm_forward<F>(const float*, const float*, F::T*, float*, std::int64_t, std::int64_t, \
                                   float, float*);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

// With xhat = x * rstd and g = dy * weight (y = xhat * weight):
//   dx = rstd * (g - xhat * mean(g * xhat)) = rstd * (g - x * rstd^2 * mean(g * x))
//   dweight += sum_rows dy * xhat.
// One pass over the rows in order, as layernorm_backward: dweight's sums are
// then in row order whatever the thread count, and dy and x are read once.
void rmsnorm_backward(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                      float* dweight, std::int64_t n, std::int64_t c, bool accumulate_dx) {
  const float inv_c = 1.0f / static_cast<float>(c);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* dyi = dy + i * c;
    const float* xi = x + i * c;
    float* dxi = dx + i * c;
    const float s = rstd[i];
    cpu::LaneSums sum_gx;
    sum_gx.add(c, [&](auto at) { return at(dyi) * at(weight) * at(xi); });
    const float k = s * s * s * (sum_gx.total() * inv_c);
    for (std::int64_t j = 0; j < c; ++j) dweight[j] += dyi[j] * (xi[j] * s);
    // One loop per case, each vectorised without a branch inside.
    auto write_dx = [&](auto accumulate) {
      for (std::int64_t j = 0; j < c; ++j) {
        const float d = s * (dyi[j] * weight[j]) - k * xi[j];
        dxi[j] = accumulate ? dxi[j] + d : d;
      }
    };
    accumulate_dx ? write_dx(std::true_type{}) : write_dx(std::false_type{});
  }
}

}  // namespace dtrain::nn
