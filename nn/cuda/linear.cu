#include "nn/cuda/check.h"
#include "nn/cuda/linear.h"
#include "nn/linear.h"

namespace dtrain::nn::cuda {
namespace {

// A block of 32 x 8 threads owns 32 columns; its 8 thread rows take rows
// i = y mod 8 in order, and their partial sums are added in a fixed order.
constexpr int kCols = 32, kRowLanes = 8;

__global__ void column_sums_kernel(const float* m, float* sums, std::int64_t rows,
                                   std::int64_t cols) {
  __shared__ float part[kRowLanes][kCols];
  const std::int64_t j = blockIdx.x * std::int64_t{kCols} + threadIdx.x;
  float s = 0.0f;
  if (j < cols) {
    for (std::int64_t i = threadIdx.y; i < rows; i += kRowLanes) s += m[i * cols + j];
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    for (int r = 1; r < kRowLanes; ++r) s += part[r][threadIdx.x];
    sums[j] += s;
  }
}

}  // namespace

void add_column_sums(const float* m, float* sums, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const auto blocks = static_cast<unsigned>((cols + kCols - 1) / kCols);
  column_sums_kernel<<<blocks, dim3(kCols, kRowLanes), 0, stream>>>(m, sums, rows, cols);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void linear_forward(Blas& blas, const float* x, const float* weight, const float* bias, float* y,
                    std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate,
                    cudaStream_t stream) {
  gemm(blas, linear_forward_gemm(n, in, out, accumulate), x, weight, y, bias, stream);
}

void linear_backward(Blas& blas, const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias, std::int64_t n, std::int64_t in,
                     std::int64_t out, bool accumulate_dx, cudaStream_t stream) {
  if (dx != nullptr) gemm(blas, linear_input_grad_gemm(n, in, out, accumulate_dx), dy, weight, dx, nullptr, stream);
  gemm(blas, linear_weight_grad_gemm(n, in, out), dy, x, dweight, nullptr, stream);
  if (dbias != nullptr) add_column_sums(dy, dbias, n, out, stream);
}

}  // namespace dtrain::nn::cuda
