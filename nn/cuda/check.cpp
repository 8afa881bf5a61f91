#include "nn/cuda/check.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::nn::cuda {

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  throw Error(fmt::format("cuda: {} failed at {}:{}: {} ({})", call, file, line,
                          cudaGetErrorString(e), cudaGetErrorName(e)));
}

void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(fmt::format("cublas: {} failed at {}:{}: {} ({})", call, file, line,
                          cublasGetStatusString(s), cublasGetStatusName(s)));
}

void throw_invalid_argument(const char* what, const char* file, int line) {
  throw Error(fmt::format("nn/cuda: invalid argument at {}:{}: {}", file, line, what));
}

int device_count(std::string* why) {
  int count = 0;  // left unwritten when there is no driver
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    if (why != nullptr) *why = fmt::format("no usable CUDA device: {}", cudaGetErrorString(e));
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device found";
  return count;
}

}  // namespace dtrain::nn::cuda
