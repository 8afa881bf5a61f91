#include "nn/cuda/layernorm.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

using detail::block_sum;
using detail::kBlock;

// One block per row: mean, then the centred variance (two passes, as the CPU).
template <DType Y>
__global__ void layernorm_forward_kernel(const float* x, const float* weight, const float* bias, Storage<Y>* y,
                                         float* mean, float* rstd, std::int64_t c, float eps, float* x_copy) {
  const std::int64_t row = blockIdx.x;
  const float* xi = x + row * c;
  Storage<Y>* yi = y + row * c;
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += xi[j];
  const float m = block_sum(sum) / static_cast<float>(c);
  float var = 0.0f;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = xi[j] - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(block_sum(var) / static_cast<float>(c) + eps);
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    yi[j] = detail::Format<Y>::store((xi[j] - m) * s * weight[j] + bias[j]);
    if (x_copy != nullptr) x_copy[row * c + j] = xi[j];
  }
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight; one block per row.
__global__ void layernorm_dx_kernel(const float* dy, const float* x, const float* weight,
                                    const float* mean, const float* rstd, float* dx, std::int64_t c,
                                    bool accumulate) {
  const std::int64_t row = blockIdx.x;
  const float* dyi = dy + row * c;
  const float* xi = x + row * c;
  float* dxi = dx + row * c;
  const float m = mean[row], s = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float g = dyi[j] * weight[j];
    sum_g += g;
    sum_gx += g * ((xi[j] - m) * s);
  }
  const float inv_c = 1.0f / static_cast<float>(c);
  const float mean_g = block_sum(sum_g) * inv_c;
  const float mean_gx = block_sum(sum_gx) * inv_c;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float xhat = (xi[j] - m) * s;
    const float v = s * (dyi[j] * weight[j] - mean_g - xhat * mean_gx);
    dxi[j] = accumulate ? dxi[j] + v : v;
  }
}

// dweight[j] += sum_i dy[i,j] * xhat[i,j], dbias[j] += sum_i dy[i,j], in row order.
__global__ void layernorm_params_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                        float* dweight, float* dbias, std::int64_t n, std::int64_t c) {
  float* const out[2] = {dweight, dbias};
  detail::add_column_sums<2>(
      [=](std::int64_t i, std::int64_t j) {
        const float g = dy[i * c + j];
        return detail::Sums<2>{{g * ((x[i * c + j] - mean[i]) * rstd[i]), g}};
      },
      n, c, out);
}

}  // namespace

template <DType Y>
void layernorm_forward(const float* x, const float* weight, const float* bias, Storage<Y>* y, float* mean,
                       float* rstd, std::int64_t n, std::int64_t c, float eps, float* x_copy, cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  layernorm_forward_kernel<Y><<<static_cast<unsigned>(n), kBlock, 0, stream>>>(x, weight, bias, y, mean, rstd, c, eps,
                                                                               x_copy);
  DTRAIN_CUDA_LAUNCHED();
}

#define DTRAIN_INSTANTIATE(Y)                                                                                  \
  template void layernorm_forward<Y>(const float*, const float*, const float*, Storage<Y>*, float*, float*, \
                                     std::int64_t, std::int64_t, float, float*, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean, const float* rstd,
                        float* dx, float* dweight, float* dbias, std::int64_t n, std::int64_t c, bool accumulate_dx,
                        cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  layernorm_dx_kernel<<<static_cast<unsigned>(n), kBlock, 0, stream>>>(dy, x, weight, mean, rstd, dx, c,
                                                                       accumulate_dx);
  DTRAIN_CUDA_LAUNCHED();
  layernorm_params_kernel<<<detail::column_sum_grid(c), dim3(detail::kSumCols, detail::kSumLanes), 0, stream>>>(
      dy, x, mean, rstd, dweight, dbias, n, c);
  DTRAIN_CUDA_LAUNCHED();
}

}  // namespace dtrain::nn::cuda
