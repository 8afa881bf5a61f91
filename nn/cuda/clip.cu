#include "nn/cuda/check.h"
#include "nn/cuda/clip.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

constexpr std::int64_t kChunk = 1024;  // nn::sum_of_squares's float chunk

// Each block sums whole chunks (float within a chunk, double across chunks).
__global__ void sum_of_squares_kernel(const float* x, std::int64_t n, double* sum_sq) {
  double total = 0.0;
  for (std::int64_t c = blockIdx.x * kChunk; c < n; c += std::int64_t{gridDim.x} * kChunk) {
    float partial = 0.0f;
    for (std::int64_t i = c + threadIdx.x; i < c + kChunk && i < n; i += blockDim.x) {
      partial += x[i] * x[i];
    }
    total += detail::block_sum(partial);
  }
  if (threadIdx.x == 0 && total != 0.0) atomicAdd(sum_sq, total);
}

__global__ void clip_factor_kernel(const double* sum_sq, float max_norm, float* factor,
                                   float* norm) {
  const double global_norm = sqrt(*sum_sq);
  if (norm != nullptr) *norm = static_cast<float>(global_norm);
  float f = 1.0f;
  if (max_norm > 0.0f) {
    const double coef = static_cast<double>(max_norm) / (global_norm + 1e-6);
    f = coef < 1.0 ? static_cast<float>(coef) : 1.0f;
  }
  *factor = f;
}

__global__ void scale_kernel(float* x, std::int64_t n, const float* factor) {
  const float f = *factor;
  if (f == 1.0f) return;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    x[i] *= f;
  }
}

}  // namespace

void sum_of_squares(const float* x, std::int64_t n, double* sum_sq, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = detail::grid_for(n, static_cast<int>(kChunk));
  sum_of_squares_kernel<<<grid, detail::kBlock, 0, stream>>>(x, n, sum_sq);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void clip_factor(const double* sum_sq, float max_norm, float* factor, float* norm,
                 cudaStream_t stream) {
  clip_factor_kernel<<<1, 1, 0, stream>>>(sum_sq, max_norm, factor, norm);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void scale(float* x, std::int64_t n, const float* factor, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(x, n, factor);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

}  // namespace dtrain::nn::cuda
