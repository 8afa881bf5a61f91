#include "nn/cuda/cross_entropy.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

using detail::block_sum;
using detail::kBlock;

struct MaxAt {
  float value;
  std::int64_t index;
};

// The larger value; on ties the smaller index (the CPU's first maximum).
__device__ MaxAt better(MaxAt a, MaxAt b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

__device__ MaxAt block_argmax(MaxAt m) {
  __shared__ float values[32];
  __shared__ std::int64_t indices[32];
  for (int o = 16; o > 0; o >>= 1) {
    m = better(m, MaxAt{__shfl_xor_sync(0xffffffffu, m.value, o),
                        __shfl_xor_sync(0xffffffffu, m.index, o)});
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) {
    values[warp] = m.value;
    indices[warp] = m.index;
  }
  __syncthreads();
  MaxAt r{values[0], indices[0]};
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
    r = better(r, MaxAt{values[w], indices[w]});
  return r;
}

static_assert(sizeof(CrossEntropyTotals::correct) == sizeof(unsigned long long));

// One block per row.
__global__ void cross_entropy_forward_kernel(const float* logits, const std::int32_t* targets, float* probs,
                                             std::int64_t v, CrossEntropyTotals* totals) {
  const std::int64_t row = blockIdx.x;
  const float* x = logits + row * v;
  float* p = probs + row * v;
  const std::int32_t target = targets[row];
  // Read before any thread writes p (probs may alias logits): the first
  // writes follow block_argmax's barriers.
  const float target_logit = threadIdx.x == 0 ? x[target] : 0.0f;
  MaxAt m{-INFINITY, v};
  for (std::int64_t j = threadIdx.x; j < v; j += blockDim.x) m = better(m, MaxAt{x[j], j});
  const MaxAt top = block_argmax(m);
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    const float e = detail::fast_exp(x[j] - top.value);
    p[j] = e;  // each thread reads and writes only its own columns
    sum += e;
  }
  sum = block_sum(sum);
  const float inv = 1.0f / sum;
  for (std::int64_t j = threadIdx.x; j < v; j += blockDim.x) p[j] *= inv;
  if (threadIdx.x != 0 || totals == nullptr) return;
  // -log softmax[target] = logsumexp - x[target], without forming log(p).
  atomicAdd(&totals->loss_sum, static_cast<double>(logf(sum) + top.value - target_logit));
  if (top.index == target) atomicAdd(reinterpret_cast<unsigned long long*>(&totals->correct), 1ull);
}

__global__ void cross_entropy_backward_kernel(float* g, const std::int32_t* targets, std::int64_t n, std::int64_t v,
                                              float scale) {
  detail::for_each_index(n * v, [=](std::int64_t i) {
    const float scaled = g[i] * scale;
    g[i] = (i % v) == targets[i / v] ? scaled - scale : scaled;
  });
}

}  // namespace

void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs, std::int64_t n,
                           std::int64_t v, CrossEntropyTotals* totals, cudaStream_t stream) {
  if (n == 0 || v == 0) return;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(n), kBlock, 0, stream>>>(logits, targets, probs, v, totals);
  DTRAIN_CUDA_LAUNCHED();
}

void cross_entropy_backward(float* probs_to_grad, const std::int32_t* targets, std::int64_t n, std::int64_t v,
                            float scale, cudaStream_t stream) {
  detail::launch(cross_entropy_backward_kernel, n * v, stream, probs_to_grad, targets, n, v, scale);
}

}  // namespace dtrain::nn::cuda
