#include "nn/cuda/gelu.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

template <DType D>
__global__ void gelu_forward_kernel(const Storage<D>* x, Storage<D>* y, Storage<D>* dydx, std::int64_t n) {
  using F = detail::Format<D>;
  detail::for_each_index(n, [=](std::int64_t i) {
    const float v = F::load(x[i]);
    const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, detail::fast_erf(__fmul_rn(v, kInvSqrt2))));
    y[i] = F::store(__fmul_rn(v, cdf));
    if (dydx != nullptr) {
      const float pdf = __fmul_rn(kInvSqrt2Pi, detail::fast_exp(__fmul_rn(__fmul_rn(-0.5f, v), v)));
      dydx[i] = F::store(__fadd_rn(cdf, __fmul_rn(v, pdf)));  // may overwrite x[i], already read
    }
  });
}

template <DType D>
__global__ void gelu_backward_kernel(const Storage<D>* dy, const Storage<D>* dydx, Storage<D>* dx, std::int64_t n) {
  using F = detail::Format<D>;
  detail::for_each_index(n, [=](std::int64_t i) { dx[i] = F::store(__fmul_rn(F::load(dy[i]), F::load(dydx[i]))); });
}

// Each element once, by the thread that owns its column (device_math.cuh's
// add_column_sums), which also adds it to the column's sum.
template <DType D>
__global__ void gelu_backward_bias_kernel(const Storage<D>* dy, const Storage<D>* dydx, Storage<D>* dx,
                                          float* dbias, std::int64_t n, std::int64_t c) {
  using F = detail::Format<D>;
  float* const out[1] = {dbias};
  detail::add_column_sums<1>(
      [=](std::int64_t i, std::int64_t j) {
        const std::int64_t k = i * c + j;
        const float v = __fmul_rn(F::load(dy[k]), F::load(dydx[k]));
        dx[k] = F::store(v);
        return detail::Sums<1>{{v}};
      },
      n, c, out);
}

}  // namespace

template <DType D>
void gelu_forward(const Storage<D>* x, Storage<D>* y, Storage<D>* dydx, std::int64_t n, cudaStream_t stream) {
  detail::launch(gelu_forward_kernel<D>, n, stream, x, y, dydx, n);
}

template <DType D>
void gelu_backward(const Storage<D>* dy, const Storage<D>* dydx, Storage<D>* dx, float* dbias, std::int64_t n,
                   std::int64_t c, cudaStream_t stream) {
  if (dbias == nullptr) return detail::launch(gelu_backward_kernel<D>, n * c, stream, dy, dydx, dx, n * c);
  if (n == 0 || c == 0) return;
  gelu_backward_bias_kernel<D><<<detail::column_sum_grid(c), dim3(detail::kSumCols, detail::kSumLanes), 0, stream>>>(
      dy, dydx, dx, dbias, n, c);
  DTRAIN_CUDA_LAUNCHED();
}

#define DTRAIN_INSTANTIATE(D)                                                                                   \
  template void gelu_forward<D>(const Storage<D>*, Storage<D>*, Storage<D>*, std::int64_t, cudaStream_t);       \
  template void gelu_backward<D>(const Storage<D>*, const Storage<D>*, Storage<D>*, float*, std::int64_t,      \
                                 std::int64_t, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn::cuda
