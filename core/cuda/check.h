// Checks for every CUDA runtime, cuBLAS and NCCL call of the CUDA plugin
// (nn/cuda/, comm/nccl/): DTRAIN_CUDA_CHECK(call) throws when the call fails,
// naming the device ("cuda:0"), the call, file:line and the library's own
// error text. A failed NCCL call is a CommError, the others are Errors.
// Also the device count that tolerates a machine without a driver.
//
// Free of fmt (nvcc cannot compile it), so .cu files include it too.
// Threading: any thread.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace dtrain::cuda {

// Whether a status is a failure. ncclInProgress is not: a non-blocking
// communicator reports it while it still queues an operation.
inline bool failed(cudaError_t e) { return e != cudaSuccess; }
inline bool failed(cublasStatus_t s) { return s != CUBLAS_STATUS_SUCCESS; }
inline bool failed(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

// Throw for a failed `call` at file:line on CUDA device `device` (-1: the
// calling thread's current one). A CUDA error is also cleared, so a later
// launch check does not report it again.
[[noreturn]] void throw_failure(cudaError_t e, const char* call, const char* file, int line, int device = -1);
[[noreturn]] void throw_failure(cublasStatus_t s, const char* call, const char* file, int line, int device = -1);
[[noreturn]] void throw_failure(ncclResult_t r, const char* call, const char* file, int line, int device = -1);

// "cuda:N": device N, or the calling thread's current device when N < 0
// ("cuda" when there is none to name).
std::string device_name(int device = -1);

// CUDA devices this process can use; 0, with the reason in `why`, when the
// driver or a device is missing (cudaGetDeviceCount's error is cleared).
int device_count(std::string* why);

}  // namespace dtrain::cuda

// DTRAIN_CUDA_CHECK(cudaMemcpyAsync(...)), DTRAIN_CUDA_CHECK(cublasGemmEx(...)),
// DTRAIN_CUDA_CHECK(ncclAllReduce(...)): throws unless the call succeeded.
#define DTRAIN_CUDA_CHECK(call)                                                      \
  do {                                                                               \
    const auto dtrain_cuda_status_ = (call);                                         \
    if (::dtrain::cuda::failed(dtrain_cuda_status_)) {                               \
      ::dtrain::cuda::throw_failure(dtrain_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

// After a kernel launch: reports (and clears) a bad launch. Does not
// synchronise, so a fault inside the kernel surfaces at a later call.
#define DTRAIN_CUDA_LAUNCHED() DTRAIN_CUDA_CHECK(cudaGetLastError())
