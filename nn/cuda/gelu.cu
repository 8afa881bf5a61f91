#include "nn/cuda/gelu.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kTanhCubic = 0.044715f;

// The erf form: cdf = Phi(x), y = x cdf, dydx = cdf + x phi(x).
__device__ __forceinline__ float gelu_erf(float v, float* dydx) {
  const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, detail::fast_erf(__fmul_rn(v, kInvSqrt2))));
  if (dydx != nullptr) {
    const float pdf = __fmul_rn(kInvSqrt2Pi, detail::fast_exp(__fmul_rn(__fmul_rn(-0.5f, v), v)));
    *dydx = __fadd_rn(cdf, __fmul_rn(v, pdf));
  }
  return __fmul_rn(v, cdf);
}

// The tanh form, as nn/gelu.cpp computes it: through s = 0.5 (1 + tanh(u))
// = sigmoid(2u) and 1 - tanh(u)^2 = 4 s (1 - s), u = sqrt(2/pi) (x + 0.044715 x^3):
//   y = x s,  dydx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
// s and 1 - s being r = 1 / (1 + e) and e r, e = exp(-2|u|), one each by
// the sign of x (neither cancels where it is small).
__device__ __forceinline__ float gelu_tanh(float v, float* dydx) {
  const float u =
      __fmul_rn(kSqrt2OverPi, __fadd_rn(v, __fmul_rn(__fmul_rn(__fmul_rn(kTanhCubic, v), v), v)));
  const float e = detail::fast_exp(__fmul_rn(-2.0f, fabsf(u)));
  const float r = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
  const float er = __fmul_rn(e, r);
  const float s = v >= 0.0f ? r : er;
  if (dydx != nullptr) {
    const float one_minus_s = v >= 0.0f ? er : r;
    const float slope = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * kTanhCubic, v), v));
    *dydx = __fadd_rn(s, __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(2.0f, v), s), one_minus_s), kSqrt2OverPi),
                                   slope));
  }
  return __fmul_rn(v, s);
}

template <DType D, GeluForm kForm>
__global__ void gelu_forward_kernel(const Storage<D>* x, Storage<D>* y, Storage<D>* dydx, std::int64_t n) {
  using F = detail::Format<D>;
  detail::for_each_index(n, [=](std::int64_t i) {
    const float v = F::load(x[i]);
    float d = 0.0f;
    float* want_d = dydx != nullptr ? &d : nullptr;
    y[i] = F::store(kForm == GeluForm::tanh ? gelu_tanh(v, want_d) : gelu_erf(v, want_d));
    if (dydx != nullptr) dydx[i] = F::store(d);  // may overwrite x[i], already read
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

// The form is chosen once per call: each has its own kernel.
template <DType D>
void gelu_forward(const Storage<D>* x, Storage<D>* y, Storage<D>* dydx, std::int64_t n, GeluForm form,
                  cudaStream_t stream) {
  if (form == GeluForm::tanh) return detail::launch(gelu_forward_kernel<D, GeluForm::tanh>, n, stream, x, y, dydx, n);
  detail::launch(gelu_forward_kernel<D, GeluForm::erf>, n, stream, x, y, dydx, n);
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
  template void gelu_forward<D>(const Storage<D>*, Storage<D>*, Storage<D>*, std::int64_t, GeluForm,           \
                                cudaStream_t);                                                                 \
  template void gelu_backward<D>(const Storage<D>*, const Storage<D>*, Storage<D>*, float*, std::int64_t,      \
                                 std::int64_t, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn::cuda
