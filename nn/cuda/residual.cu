#include "nn/cuda/residual.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

__global__ void residual_kernel(const float* x, const float* branch, float* out, std::int64_t n) {
  detail::for_each_index(n, [=](std::int64_t i) { out[i] = x[i] + branch[i]; });
}

}  // namespace

void residual(const float* x, const float* branch, float* out, std::int64_t n, cudaStream_t stream) {
  detail::launch(residual_kernel, n, stream, x, branch, out, n);
}

}  // namespace dtrain::nn::cuda
