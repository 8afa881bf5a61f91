#include "nn/cuda/check.h"
#include "nn/cuda/device_math.cuh"
#include "nn/cuda/gelu.h"

namespace dtrain::nn::cuda {
namespace {

using detail::grid_for;
using detail::kBlock;

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// F loads and stores one element type (detail::F32, Bf16 or F16); T is its storage.
template <class F, class T>
__global__ void gelu_forward_kernel(const T* x, T* y, T* dydx, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float v = F::load(x[i]);
    const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, detail::fast_erf(__fmul_rn(v, kInvSqrt2))));
    y[i] = F::store(__fmul_rn(v, cdf));
    if (dydx != nullptr) {
      const float pdf = __fmul_rn(kInvSqrt2Pi, detail::fast_exp(__fmul_rn(__fmul_rn(-0.5f, v), v)));
      dydx[i] = F::store(__fadd_rn(cdf, __fmul_rn(v, pdf)));  // may overwrite x[i], already read
    }
  }
}

template <class F, class T>
__global__ void gelu_backward_kernel(const T* dy, const T* dydx, T* dx, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    dx[i] = F::store(F::load(dy[i]) * F::load(dydx[i]));
  }
}

}  // namespace

void gelu_forward(const float* x, float* y, float* dydx, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<detail::F32><<<grid_for(n), kBlock, 0, stream>>>(x, y, dydx, n);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void gelu_backward(const float* dy, const float* dydx, float* dx, std::int64_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<detail::F32><<<grid_for(n), kBlock, 0, stream>>>(dy, dydx, dx, n);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void gelu_forward_half(DType dtype, const std::uint16_t* x, std::uint16_t* y, std::uint16_t* dydx,
                       std::int64_t n, cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(dtype == DType::bf16 || dtype == DType::f16, "dtype must be bf16 or f16");
  if (n == 0) return;
  if (dtype == DType::bf16) {
    gelu_forward_kernel<detail::Bf16><<<grid_for(n), kBlock, 0, stream>>>(x, y, dydx, n);
  } else {
    gelu_forward_kernel<detail::F16><<<grid_for(n), kBlock, 0, stream>>>(x, y, dydx, n);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void gelu_backward_half(DType dtype, std::uint16_t* dy_dx, const std::uint16_t* dydx,
                        std::int64_t n, cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(dtype == DType::bf16 || dtype == DType::f16, "dtype must be bf16 or f16");
  if (n == 0) return;
  if (dtype == DType::bf16) {
    gelu_backward_kernel<detail::Bf16><<<grid_for(n), kBlock, 0, stream>>>(dy_dx, dydx, dy_dx, n);
  } else {
    gelu_backward_kernel<detail::F16><<<grid_for(n), kBlock, 0, stream>>>(dy_dx, dydx, dy_dx, n);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

}  // namespace dtrain::nn::cuda
