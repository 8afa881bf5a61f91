// The CUDA GPU as an nn::Device, from the CUDA plugin (core/plugin.h): this
// header and its .cpp need no CUDA, so every binary can offer device cuda and
// pays for CUDA's libraries only when a run asks for it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "nn/device.h"

namespace dtrain::nn {

// GPU `index` (of the visible ones) with its own compute stream; waits are
// bounded by `timeout`. Throws ConfigError naming `device` when the plugin
// cannot be loaded, Error when the GPU cannot be used.
std::unique_ptr<Device> make_cuda_device(int index, std::chrono::milliseconds timeout);

// What the plugin exports (C linkage, so the loader finds them by name).
extern "C" {
using MakeCudaDeviceFn = Device*(int index, long long timeout_ms);  // the caller owns the result
}
inline constexpr const char* kMakeCudaDeviceSymbol = "dtrain_make_cuda_device";

}  // namespace dtrain::nn
