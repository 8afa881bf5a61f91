#include "nn/cuda/rmsnorm.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

using detail::block_sum;
using detail::kBlock;

// One block per row: the mean square, then the scaled row.
template <DType Y>
__global__ void rmsnorm_forward_kernel(const float* x, const float* weight, Storage<Y>* y, float* rstd,
                                       std::int64_t c, float eps, float* x_copy) {
  const std::int64_t row = blockIdx.x;
  const float* xi = x + row * c;
  Storage<Y>* yi = y + row * c;
  float sum_sq = 0.0f;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) sum_sq += xi[j] * xi[j];
  const float s = 1.0f / sqrtf(block_sum(sum_sq) / static_cast<float>(c) + eps);
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    yi[j] = detail::Format<Y>::store(xi[j] * s * weight[j]);
    if (x_copy != nullptr) x_copy[row * c + j] = xi[j];
  }
  if (threadIdx.x == 0) rstd[row] = s;
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)), g = dy * weight, as the CPU
// arranges it: rstd g - (rstd^3 mean(g x)) x. One block per row.
__global__ void rmsnorm_dx_kernel(const float* dy, const float* x, const float* weight, const float* rstd,
                                  float* dx, std::int64_t c, bool accumulate) {
  const std::int64_t row = blockIdx.x;
  const float* dyi = dy + row * c;
  const float* xi = x + row * c;
  float* dxi = dx + row * c;
  const float s = rstd[row];
  float sum_gx = 0.0f;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) sum_gx += dyi[j] * weight[j] * xi[j];
  const float k = s * s * s * (block_sum(sum_gx) * (1.0f / static_cast<float>(c)));
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float v = s * (dyi[j] * weight[j]) - k * xi[j];
    dxi[j] = accumulate ? dxi[j] + v : v;
  }
}

// dweight[j] += sum_i dy[i,j] * x[i,j] * rstd[i], in row order.
__global__ void rmsnorm_weight_kernel(const float* dy, const float* x, const float* rstd, float* dweight,
                                      std::int64_t n, std::int64_t c) {
  float* const out[1] = {dweight};
  detail::add_column_sums<1>(
      [=](std::int64_t i, std::int64_t j) { return detail::Sums<1>{{dy[i * c + j] * (x[i * c + j] * rstd[i])}}; },
      n, c, out);
}

}  // namespace

template <DType Y>
void rmsnorm_forward(const float* x, const float* weight, Storage<Y>* y, float* rstd, std::int64_t n, std::int64_t c,
                     float eps, float* x_copy, cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  rmsnorm_forward_kernel<Y><<<static_cast<unsigned>(n), kBlock, 0, stream>>>(x, weight, y, rstd, c, eps, x_copy);
  DTRAIN_CUDA_LAUNCHED();
}

#define DTRAIN_INSTANTIATE(Y)                                                                                   \
  template void rmsnorm_forward<Y>(const float*, const float*, Storage<Y>*, float*, std::int64_t, std::int64_t, \
                                   float, float*, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

void rmsnorm_backward(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                      float* dweight, std::int64_t n, std::int64_t c, bool accumulate_dx, cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  rmsnorm_dx_kernel<<<static_cast<unsigned>(n), kBlock, 0, stream>>>(dy, x, weight, rstd, dx, c, accumulate_dx);
  DTRAIN_CUDA_LAUNCHED();
  rmsnorm_weight_kernel<<<detail::column_sum_grid(c), dim3(detail::kSumCols, detail::kSumLanes), 0, stream>>>(
      dy, x, rstd, dweight, n, c);
  DTRAIN_CUDA_LAUNCHED();
}

}  // namespace dtrain::nn::cuda
