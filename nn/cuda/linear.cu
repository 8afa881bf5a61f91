#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"
#include "nn/cuda/linear.h"

namespace dtrain::nn::cuda {
namespace {

template <DType D>
__global__ void column_sums_kernel(const Storage<D>* m, float* sums, std::int64_t rows, std::int64_t cols) {
  float* const out[1] = {sums};
  detail::add_column_sums<1>(
      [=](std::int64_t i, std::int64_t j) { return detail::Sums<1>{{detail::Format<D>::load(m[i * cols + j])}}; },
      rows, cols, out);
}

}  // namespace

template <DType D>
void add_column_sums(const Storage<D>* m, float* sums, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  column_sums_kernel<D><<<detail::column_sum_grid(cols), dim3(detail::kSumCols, detail::kSumLanes), 0, stream>>>(
      m, sums, rows, cols);
  DTRAIN_CUDA_LAUNCHED();
}

#define DTRAIN_INSTANTIATE(D) \
  template void add_column_sums<D>(const Storage<D>*, float*, std::int64_t, std::int64_t, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn::cuda
