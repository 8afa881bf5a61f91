#include "nn/cuda/bias.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

template <DType D>
__global__ void broadcast_bias_kernel(const float* bias, Storage<D>* c, std::int64_t m, std::int64_t n,
                                      std::int64_t ldc, std::int64_t stride_c, std::int64_t batch, bool accumulate) {
  using F = detail::Format<D>;
  detail::for_each_index(batch * m * n, [=](std::int64_t i) {
    const std::int64_t item = i / (m * n), row = (i / n) % m, col = i % n;
    Storage<D>* p = c + item * stride_c + row * ldc + col;
    *p = F::store(accumulate ? F::load(*p) + bias[col] : bias[col]);
  });
}

template <DType D>
void launch(const float* bias, void* c, std::int64_t m, std::int64_t n, std::int64_t ldc, std::int64_t stride_c,
            std::int64_t batch, bool accumulate, cudaStream_t stream) {
  detail::launch(broadcast_bias_kernel<D>, batch * m * n, stream, bias, static_cast<Storage<D>*>(c), m, n, ldc,
                 stride_c, batch, accumulate);
}

}  // namespace

void broadcast_bias(const float* bias, void* c, DType c_type, std::int64_t m, std::int64_t n, std::int64_t ldc,
                    std::int64_t stride_c, std::int64_t batch, bool accumulate, cudaStream_t stream) {
  if (c_type == DType::f32) return launch<DType::f32>(bias, c, m, n, ldc, stride_c, batch, accumulate, stream);
  if (c_type == DType::bf16) return launch<DType::bf16>(bias, c, m, n, ldc, stride_c, batch, accumulate, stream);
  launch<DType::f16>(bias, c, m, n, ldc, stride_c, batch, accumulate, stream);
}

}  // namespace dtrain::nn::cuda
