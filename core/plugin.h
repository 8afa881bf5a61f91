// Plugins: parts of dtrain built as shared libraries and loaded only when a
// run asks for them, so a binary that never uses them neither links nor
// maps their dependencies. The CUDA plugin (libdtrain_cuda.so: the CUDA
// device and the NCCL backend, with cudart, cuBLAS and NCCL behind them) is
// the one plugin today.
//
// Where a plugin is looked for, first found wins: $DTRAIN_PLUGIN_DIR, the
// running binary's folder, its ../lib, then the dynamic loader's own search
// (LD_LIBRARY_PATH, the system's folders).
//
// Threading: any thread; a plugin is loaded once per process and never unloaded.
#pragma once

#include <string>

namespace dtrain {

// What a plugin exports: its extern "C" entry points carry this mark; the
// rest of the plugin is hidden (built with -fvisibility=hidden).
#define DTRAIN_PLUGIN_EXPORT __attribute__((visibility("default")))

// The CUDA plugin's file name.
inline constexpr const char* kCudaPlugin = "libdtrain_cuda.so";

// The address of `symbol` in plugin `library`, loading it on first use.
// Throws ConfigError naming `field` (the config field that asked for it) with
// the library, every place it was looked for and the loader's error, and what
// to do, when the library or the symbol cannot be loaded.
void* plugin_symbol(const char* library, const char* symbol, const char* field);

// Whether `library` can be loaded here (it is, if so); `why` says why not.
bool plugin_available(const char* library, std::string* why);

// CUDA devices this process can use (through the CUDA plugin); 0 with the
// reason in `why` when the plugin, the driver or a device is missing.
int cuda_device_count(std::string* why);
// What the CUDA plugin exports for it (C linkage, found by name).
extern "C" {
using CudaDeviceCountFn = int(std::string* why);
}
inline constexpr const char* kCudaDeviceCountSymbol = "dtrain_cuda_device_count";

}  // namespace dtrain
