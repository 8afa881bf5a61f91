#include "nn/cuda/check.h"
#include "nn/cuda/device_math.cuh"
#include "nn/cuda/layernorm.h"
#include "nn/layernorm.h"

namespace dtrain::nn::cuda {
namespace {

using detail::block_sum;
using detail::kBlock;

// One block per row: mean, then the centred variance (two passes, as the CPU).
template <class F, class Out>
__global__ void layernorm_forward_kernel(const float* x, const float* weight, const float* bias,
                                         Out* y, float* mean, float* rstd, std::int64_t c) {
  const std::int64_t row = blockIdx.x;
  const float* xi = x + row * c;
  Out* yi = y + row * c;
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += xi[j];
  const float m = block_sum(sum) / static_cast<float>(c);
  float var = 0.0f;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = xi[j] - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(block_sum(var) / static_cast<float>(c) + kLayerNormEps);
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    yi[j] = F::store((xi[j] - m) * s * weight[j] + bias[j]);
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

// dweight[j] += sum_i dy[i,j] * xhat[i,j], dbias[j] += sum_i dy[i,j]. A block of
// 32 x 8 threads owns 32 columns; its 8 rows of threads take rows i = y mod 8
// in order and the 8 partial sums are added in a fixed order.
constexpr int kCols = 32, kRowLanes = 8;
__global__ void layernorm_params_kernel(const float* dy, const float* x, const float* mean,
                                        const float* rstd, float* dweight, float* dbias,
                                        std::int64_t n, std::int64_t c) {
  __shared__ float part_w[kRowLanes][kCols], part_b[kRowLanes][kCols];
  const std::int64_t j = blockIdx.x * std::int64_t{kCols} + threadIdx.x;
  float w = 0.0f, b = 0.0f;
  if (j < c) {
    for (std::int64_t i = threadIdx.y; i < n; i += kRowLanes) {
      const float g = dy[i * c + j];
      w += g * ((x[i * c + j] - mean[i]) * rstd[i]);
      b += g;
    }
  }
  part_w[threadIdx.y][threadIdx.x] = w;
  part_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    for (int r = 1; r < kRowLanes; ++r) {
      w += part_w[r][threadIdx.x];
      b += part_b[r][threadIdx.x];
    }
    dweight[j] += w;
    dbias[j] += b;
  }
}

template <class F, class Out>
void launch_forward(const float* x, const float* weight, const float* bias, Out* y, float* mean,
                    float* rstd, std::int64_t n, std::int64_t c, cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(n < (std::int64_t{1} << 31), "layernorm: more rows than a grid holds");
  if (n == 0 || c == 0) return;
  layernorm_forward_kernel<F>
      <<<static_cast<unsigned>(n), kBlock, 0, stream>>>(x, weight, bias, y, mean, rstd, c);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

}  // namespace

void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                       float* mean, float* rstd, std::int64_t n, std::int64_t c,
                       cudaStream_t stream) {
  launch_forward<detail::F32>(x, weight, bias, y, mean, rstd, n, c, stream);
}

void layernorm_forward_half(const float* x, const float* weight, const float* bias,
                            std::uint16_t* y, DType y_type, float* mean, float* rstd,
                            std::int64_t n, std::int64_t c, cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(y_type == DType::bf16 || y_type == DType::f16, "y_type must be bf16 or f16");
  if (y_type == DType::bf16) {
    launch_forward<detail::Bf16>(x, weight, bias, y, mean, rstd, n, c, stream);
  } else {
    launch_forward<detail::F16>(x, weight, bias, y, mean, rstd, n, c, stream);
  }
}

void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, float* dx, float* dweight, float* dbias, std::int64_t n,
                        std::int64_t c, bool accumulate_dx, cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(n < (std::int64_t{1} << 31), "layernorm: more rows than a grid holds");
  if (n == 0 || c == 0) return;
  layernorm_dx_kernel<<<static_cast<unsigned>(n), kBlock, 0, stream>>>(dy, x, weight, mean, rstd,
                                                                       dx, c, accumulate_dx);
  DTRAIN_CUDA_LAUNCH_CHECK();
  const auto col_blocks = static_cast<unsigned>((c + kCols - 1) / kCols);
  layernorm_params_kernel<<<col_blocks, dim3(kCols, kRowLanes), 0, stream>>>(dy, x, mean, rstd,
                                                                             dweight, dbias, n, c);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

}  // namespace dtrain::nn::cuda
