#include "nn/cuda/swiglu.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

// As nn/swiglu.cpp computes them, with the CPU's fast_exp, so both devices
// agree to an ulp or two: sigmoid(g) = 1 / (1 + e), e = exp(-g), and
// 1 - sigmoid(g) = e sigmoid(g) (no cancellation where sigmoid(g) -> 1).
struct Sigmoid {
  float s, one_minus_s;
};
__device__ __forceinline__ Sigmoid sigmoid(float g) {
  const float e = detail::fast_exp(-g);
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
  return {s, __fmul_rn(e, s)};
}

// silu'(g) = s (1 + g (1 - s)).
__device__ __forceinline__ float silu_grad(float g, Sigmoid sg) {
  return __fmul_rn(sg.s, __fadd_rn(1.0f, __fmul_rn(g, sg.one_minus_s)));
}

// One thread per element of a [n, c].
template <DType D>
__global__ void swiglu_forward_kernel(const Storage<D>* h, Storage<D>* a, std::int64_t n, std::int64_t c,
                                      std::int64_t ld_h, std::int64_t ld_a) {
  using F = detail::Format<D>;
  detail::for_each_index(n * c, [=](std::int64_t i) {
    const std::int64_t row = i / c, j = i % c;
    const float g = F::load(h[row * ld_h + j]), u = F::load(h[row * ld_h + c + j]);
    a[row * ld_a + j] = F::store(__fmul_rn(__fmul_rn(g, sigmoid(g).s), u));
  });
}

// One thread per element of da [n, c]: both gradients of its gate and up.
template <DType D>
__global__ void swiglu_backward_kernel(const Storage<D>* da, const Storage<D>* h, Storage<D>* d_h, std::int64_t n,
                                       std::int64_t c, std::int64_t ld_a, std::int64_t ld_h) {
  using F = detail::Format<D>;
  detail::for_each_index(n * c, [=](std::int64_t i) {
    const std::int64_t row = i / c, j = i % c;
    const float g = F::load(h[row * ld_h + j]), u = F::load(h[row * ld_h + c + j]);
    const float d = F::load(da[row * ld_a + j]);
    const Sigmoid sg = sigmoid(g);
    d_h[row * ld_h + j] = F::store(__fmul_rn(__fmul_rn(d, u), silu_grad(g, sg)));
    d_h[row * ld_h + c + j] = F::store(__fmul_rn(d, __fmul_rn(g, sg.s)));
  });
}

// Each element of d_h [n, 2c] once, by the thread that owns its column
// (device_math.cuh's add_column_sums), which also adds it to the column's sum.
template <DType D>
__global__ void swiglu_backward_bias_kernel(const Storage<D>* da, const Storage<D>* h, Storage<D>* d_h,
                                            float* d_bias, std::int64_t n, std::int64_t c, std::int64_t ld_a,
                                            std::int64_t ld_h) {
  using F = detail::Format<D>;
  float* const out[1] = {d_bias};
  detail::add_column_sums<1>(
      [=](std::int64_t row, std::int64_t col) {
        const std::int64_t j = col < c ? col : col - c;
        const float g = F::load(h[row * ld_h + j]), d = F::load(da[row * ld_a + j]);
        const Sigmoid sg = sigmoid(g);
        const float v = col < c ? __fmul_rn(__fmul_rn(d, F::load(h[row * ld_h + c + j])), silu_grad(g, sg))
                                : __fmul_rn(d, __fmul_rn(g, sg.s));
        d_h[row * ld_h + col] = F::store(v);
        return detail::Sums<1>{{v}};
      },
      n, 2 * c, out);
}

}  // namespace

template <DType D>
void swiglu_forward(const Storage<D>* h, Storage<D>* a, std::int64_t n, std::int64_t c, std::int64_t ld_h,
                    std::int64_t ld_a, cudaStream_t stream) {
  detail::launch(swiglu_forward_kernel<D>, n * c, stream, h, a, n, c, ld_h != 0 ? ld_h : 2 * c, ld_a != 0 ? ld_a : c);
}

template <DType D>
void swiglu_backward(const Storage<D>* da, const Storage<D>* h, Storage<D>* d_h, float* d_bias, std::int64_t n,
                     std::int64_t c, std::int64_t ld_a, std::int64_t ld_h, cudaStream_t stream) {
  if (ld_a == 0) ld_a = c;
  if (ld_h == 0) ld_h = 2 * c;
  if (d_bias == nullptr) return detail::launch(swiglu_backward_kernel<D>, n * c, stream, da, h, d_h, n, c, ld_a, ld_h);
  if (n == 0 || c == 0) return;
  swiglu_backward_bias_kernel<D><<<detail::column_sum_grid(2 * c), dim3(detail::kSumCols, detail::kSumLanes), 0,
                                   stream>>>(da, h, d_h, d_bias, n, c, ld_a, ld_h);
  DTRAIN_CUDA_LAUNCHED();
}

#define DTRAIN_INSTANTIATE(D)                                                                                        \
  template void swiglu_forward<D>(const Storage<D>*, Storage<D>*, std::int64_t, std::int64_t, std::int64_t,          \
                                  std::int64_t, cudaStream_t);                                                      \
  template void swiglu_backward<D>(const Storage<D>*, const Storage<D>*, Storage<D>*, float*, std::int64_t,           \
                                   std::int64_t, std::int64_t, std::int64_t, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn::cuda
