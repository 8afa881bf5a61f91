// Error checks for every CUDA and cuBLAS call of nn/cuda/: a failure throws
// dtrain::Error naming the call, file:line and the library's own error text.
// Also the device count that tolerates a machine without a driver.
// Host code only (.cpp and the host side of .cu files).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

namespace dtrain::nn::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t s, const char* call, const char* file,
                                     int line);
// Throws dtrain::Error with `what` when a launcher's argument check fails.
[[noreturn]] void throw_invalid_argument(const char* what, const char* file, int line);

// Number of CUDA devices this process can use; 0 with a reason in `why` when
// there is no driver or device (cudaGetDeviceCount's sticky error is cleared).
int device_count(std::string* why);

}  // namespace dtrain::nn::cuda

// DTRAIN_CUDA_TRY(cudaMemcpyAsync(...)): throws on anything but cudaSuccess.
#define DTRAIN_CUDA_TRY(call)                                                          \
  do {                                                                                 \
    const cudaError_t dtrain_cuda_e_ = (call);                                         \
    if (dtrain_cuda_e_ != cudaSuccess)                                                 \
      ::dtrain::nn::cuda::throw_cuda_error(dtrain_cuda_e_, #call, __FILE__, __LINE__); \
  } while (0)

// DTRAIN_CUBLAS_TRY(cublasGemmEx(...)): throws on anything but CUBLAS_STATUS_SUCCESS.
#define DTRAIN_CUBLAS_TRY(call)                                                            \
  do {                                                                                     \
    const cublasStatus_t dtrain_cublas_s_ = (call);                                        \
    if (dtrain_cublas_s_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::dtrain::nn::cuda::throw_cublas_error(dtrain_cublas_s_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports (and clears) a bad launch configuration.
// Does not synchronise, so an error inside the kernel surfaces at a later call.
#define DTRAIN_CUDA_LAUNCH_CHECK() DTRAIN_CUDA_TRY(cudaGetLastError())

// DTRAIN_CUDA_REQUIRE(n > 0, "n must be positive"): argument checks of launchers.
#define DTRAIN_CUDA_REQUIRE(cond, what)                                                \
  do {                                                                                 \
    if (!(cond)) ::dtrain::nn::cuda::throw_invalid_argument(what, __FILE__, __LINE__); \
  } while (0)
