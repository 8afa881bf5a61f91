#include "nn/cuda/adamw.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

// The CPU's float arithmetic, op for op (__f*_rn: no FMA contraction).
__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                             AdamWConstants k) {
  detail::for_each_index(n, [=](std::int64_t i) {
    const float g = __fmul_rn(grad[i], k.grad_scale);
    const float m = __fadd_rn(__fmul_rn(k.b1, exp_avg[i]), __fmul_rn(1.0f - k.b1, g));
    const float v = __fadd_rn(__fmul_rn(k.b2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(1.0f - k.b2, g), g));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), k.inv_bc2_sqrt), k.eps);
    param[i] = __fsub_rn(__fmul_rn(param[i], k.decay), __fdiv_rn(__fmul_rn(k.step_size, m), denom));
  });
}

constexpr std::int64_t kChunk = 1024;  // nn::sum_of_squares's float chunk

// Each block sums whole chunks (float within a chunk, double across chunks).
__global__ void sum_of_squares_kernel(const float* x, std::int64_t n, double* total) {
  double sum = 0.0;
  for (std::int64_t c = blockIdx.x * kChunk; c < n; c += std::int64_t{gridDim.x} * kChunk) {
    float partial = 0.0f;
    for (std::int64_t i = c + threadIdx.x; i < c + kChunk && i < n; i += blockDim.x) partial += x[i] * x[i];
    sum += detail::block_sum(partial);
  }
  if (threadIdx.x == 0 && sum != 0.0) atomicAdd(total, sum);
}

}  // namespace

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                  const AdamWConstants& k, cudaStream_t stream) {
  detail::launch(adamw_kernel, n, stream, param, grad, exp_avg, exp_avg_sq, n, k);
}

void sum_of_squares(const float* x, std::int64_t n, double* total, cudaStream_t stream) {
  if (n == 0) return;
  sum_of_squares_kernel<<<detail::grid_for(n, static_cast<int>(kChunk)), detail::kBlock, 0, stream>>>(x, n, total);
  DTRAIN_CUDA_LAUNCHED();
}

}  // namespace dtrain::nn::cuda
