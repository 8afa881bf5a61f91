#include "nn/cuda/convert.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

template <DType D>
__global__ void to_format_kernel(const float* src, Storage<D>* dst, std::int64_t n) {
  detail::for_each_index(n, [=](std::int64_t i) { dst[i] = detail::Format<D>::store(src[i]); });
}

template <DType D>
__global__ void widen_kernel(const Storage<D>* src, float* dst, std::int64_t n, bool accumulate) {
  detail::for_each_index(n, [=](std::int64_t i) {
    const float v = detail::Format<D>::load(src[i]);
    dst[i] = accumulate ? dst[i] + v : v;
  });
}

}  // namespace

template <DType D>
void to_format(const float* src, Storage<D>* dst, std::int64_t n, cudaStream_t stream) {
  detail::launch(to_format_kernel<D>, n, stream, src, dst, n);
}

template <DType D>
void widen(const Storage<D>* src, float* dst, std::int64_t n, bool accumulate, cudaStream_t stream) {
  detail::launch(widen_kernel<D>, n, stream, src, dst, n, accumulate);
}

#define DTRAIN_INSTANTIATE(D)                                                               \
  template void to_format<D>(const float*, Storage<D>*, std::int64_t, cudaStream_t);      \
  template void widen<D>(const Storage<D>*, float*, std::int64_t, bool, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn::cuda
