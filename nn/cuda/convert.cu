#include "nn/cuda/check.h"
#include "nn/cuda/convert.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

template <class F>
__global__ void to_half_kernel(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    dst[i] = F::store(src[i]);
  }
}

template <class F>
__global__ void to_f32_kernel(const std::uint16_t* src, float* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    dst[i] = F::load(src[i]);
  }
}

}  // namespace

void f32_to_half(const float* src, DType dtype, std::uint16_t* dst, std::int64_t n,
                 cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(dtype == DType::bf16 || dtype == DType::f16, "dtype must be bf16 or f16");
  if (n == 0) return;
  if (dtype == DType::bf16) {
    to_half_kernel<detail::Bf16><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(src, dst, n);
  } else {
    to_half_kernel<detail::F16><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(src, dst, n);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void half_to_f32(const std::uint16_t* src, DType dtype, float* dst, std::int64_t n,
                 cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(dtype == DType::bf16 || dtype == DType::f16, "dtype must be bf16 or f16");
  if (n == 0) return;
  if (dtype == DType::bf16) {
    to_f32_kernel<detail::Bf16><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(src, dst, n);
  } else {
    to_f32_kernel<detail::F16><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(src, dst, n);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

}  // namespace dtrain::nn::cuda
