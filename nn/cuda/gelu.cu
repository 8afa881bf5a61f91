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

}  // namespace

template <DType D>
void gelu_forward(const Storage<D>* x, Storage<D>* y, Storage<D>* dydx, std::int64_t n, cudaStream_t stream) {
  detail::launch(gelu_forward_kernel<D>, n, stream, x, y, dydx, n);
}

template <DType D>
void gelu_backward(const Storage<D>* dy, const Storage<D>* dydx, Storage<D>* dx, std::int64_t n,
                   cudaStream_t stream) {
  detail::launch(gelu_backward_kernel<D>, n, stream, dy, dydx, dx, n);
}

#define DTRAIN_INSTANTIATE(D)                                                                                   \
  template void gelu_forward<D>(const Storage<D>*, Storage<D>*, Storage<D>*, std::int64_t, cudaStream_t);       \
  template void gelu_backward<D>(const Storage<D>*, const Storage<D>*, Storage<D>*, std::int64_t, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn::cuda
