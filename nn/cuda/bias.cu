#include "nn/cuda/bias.h"
#include "nn/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

template <class F, class T>
__global__ void broadcast_bias_kernel(const float* bias, T* c, std::int64_t m, std::int64_t n,
                                      std::int64_t ldc, std::int64_t stride_c, std::int64_t batch,
                                      bool accumulate) {
  const std::int64_t total = batch * m * n;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t item = i / (m * n), row = (i / n) % m, col = i % n;
    T* p = c + item * stride_c + row * ldc + col;
    *p = F::store(accumulate ? F::load(*p) + bias[col] : bias[col]);
  }
}

}  // namespace

void broadcast_bias(const float* bias, void* c, DType c_type, std::int64_t m, std::int64_t n,
                    std::int64_t ldc, std::int64_t stride_c, std::int64_t batch, bool accumulate,
                    cudaStream_t stream) {
  const std::int64_t total = batch * m * n;
  if (total == 0) return;
  const unsigned grid = detail::grid_for(total);
  constexpr int block = detail::kBlock;
  if (c_type == DType::f32) {
    broadcast_bias_kernel<detail::F32><<<grid, block, 0, stream>>>(
        bias, static_cast<float*>(c), m, n, ldc, stride_c, batch, accumulate);
  } else if (c_type == DType::bf16) {
    broadcast_bias_kernel<detail::Bf16><<<grid, block, 0, stream>>>(
        bias, static_cast<std::uint16_t*>(c), m, n, ldc, stride_c, batch, accumulate);
  } else {
    DTRAIN_CUDA_REQUIRE(c_type == DType::f16, "broadcast_bias: c_type must be f32, bf16 or f16");
    broadcast_bias_kernel<detail::F16><<<grid, block, 0, stream>>>(
        bias, static_cast<std::uint16_t*>(c), m, n, ldc, stride_c, batch, accumulate);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

}  // namespace dtrain::nn::cuda
