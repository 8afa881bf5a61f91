#include "nn/cuda/dropout.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

// nn/dropout.cpp's splitmix64.
__device__ __forceinline__ std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

__global__ void dropout_kernel(float* x, std::int64_t n, std::uint32_t threshold, float scale,
                               std::uint64_t key) {
  detail::for_each_index(n, [=](std::int64_t i) {
    const auto r = static_cast<std::uint32_t>(splitmix64(key + static_cast<std::uint64_t>(i)) >> 32);
    x[i] = r >= threshold ? x[i] * scale : 0.0f;
  });
}

}  // namespace

void dropout_apply(float* x, std::int64_t n, float p, std::uint64_t key, cudaStream_t stream) {
  if (p <= 0.0f || n == 0) return;
  // The CPU's threshold and scale, computed the same way on the host.
  const auto threshold = static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0);
  const float scale = 1.0f / (1.0f - p);
  detail::launch(dropout_kernel, n, stream, x, n, threshold, scale, key);
}

}  // namespace dtrain::nn::cuda
