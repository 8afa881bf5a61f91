#include "nn/cuda/check.h"
#include "nn/cuda/device_math.cuh"
#include "nn/cuda/residual.h"

namespace dtrain::nn::cuda {
namespace {

using detail::grid_for;
using detail::kBlock;

__global__ void residual_kernel(const float* x, const float* branch, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    out[i] = x[i] + branch[i];
  }
}

}  // namespace

void residual_forward(const float* x, const float* branch, float* out, std::int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return;
  residual_kernel<<<grid_for(n), kBlock, 0, stream>>>(x, branch, out, n);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void add_inplace(float* dst, const float* src, std::int64_t n, cudaStream_t stream) {
  residual_forward(dst, src, dst, n, stream);
}

}  // namespace dtrain::nn::cuda
