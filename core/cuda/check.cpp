#include "core/cuda/check.h"

#include <filesystem>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.h"
#include "core/plugin.h"

namespace dtrain::cuda {

std::string device_name(int device) {
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return "cuda";
  }
  return fmt::format("cuda:{}", device);
}

void throw_failure(cudaError_t e, const char* call, const char* file, int line, int device) {
  cudaGetLastError();  // a sticky error stays; any other is reported once, here
  throw Error(fmt::format("{}: {} failed at {}:{}: {} ({})", device_name(device), call, file, line,
                          cudaGetErrorString(e), cudaGetErrorName(e)));
}

void throw_failure(cublasStatus_t s, const char* call, const char* file, int line, int device) {
  throw Error(fmt::format("{}: {} failed at {}:{}: {} ({})", device_name(device), call, file, line,
                          cublasGetStatusString(s), cublasGetStatusName(s)));
}

void throw_failure(ncclResult_t r, const char* call, const char* file, int line, int device) {
  throw CommError(fmt::format("{}: {} failed at {}:{}: {} (nccl {})", device_name(device), call, file, line,
                              ncclGetErrorString(r), static_cast<int>(r)));
}

int device_count(std::string* why) {
  int count = 0;  // left unwritten when there is no driver
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why == nullptr) return 0;
    // Without any driver the runtime says its version is "insufficient",
    // which reads as "upgrade the driver" on a machine that has none.
    std::error_code ec;
    if (e == cudaErrorInsufficientDriver && !std::filesystem::exists("/proc/driver/nvidia/version", ec)) {
      *why = "no NVIDIA driver was found (no /proc/driver/nvidia/version): this machine has no GPU driver loaded; "
             "run on a GPU machine or use device=cpu";
    } else {
      *why = fmt::format("no usable CUDA device: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device found";
  return count;
}

}  // namespace dtrain::cuda

// The CUDA plugin's entry point for dtrain::cuda_device_count (core/plugin.h).
extern "C" DTRAIN_PLUGIN_EXPORT int dtrain_cuda_device_count(std::string* why) {
  return dtrain::cuda::device_count(why);
}
static_assert(std::is_same_v<decltype(dtrain_cuda_device_count), dtrain::CudaDeviceCountFn>);
