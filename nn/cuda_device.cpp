#include "nn/cuda_device.h"

#include "core/plugin.h"

namespace dtrain::nn {

std::unique_ptr<Device> make_cuda_device(int index, std::chrono::milliseconds timeout) {
  auto* make = reinterpret_cast<MakeCudaDeviceFn*>(plugin_symbol(kCudaPlugin, kMakeCudaDeviceSymbol, "device"));
  return std::unique_ptr<Device>(make(index, static_cast<long long>(timeout.count())));
}

}  // namespace dtrain::nn
