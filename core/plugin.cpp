#include "core/plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {
namespace {

std::vector<std::filesystem::path> candidates(const char* library) {
  std::vector<std::filesystem::path> out;
  if (const char* dir = std::getenv("DTRAIN_PLUGIN_DIR"); dir != nullptr && *dir != '\0') out.emplace_back(dir);
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back(exe.parent_path());
    out.push_back(exe.parent_path().parent_path() / "lib");
  }
  for (auto& dir : out) dir /= library;
  out.emplace_back(library);  // the dynamic loader's own search
  return out;
}

struct Loaded {
  void* handle = nullptr;
  std::string error;  // why it could not be loaded
};

// Loads `library` once; later calls return the first outcome.
const Loaded& load(const char* library) {
  static std::mutex mu;
  static std::map<std::string, Loaded> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = loaded.try_emplace(library);
  if (!fresh) return it->second;
  std::string tried;
  for (const std::filesystem::path& path : candidates(library)) {
    if (path.has_parent_path() && !std::filesystem::exists(path)) {
      tried += fmt::format("\n  {}: not there", path.string());
      continue;
    }
    if (void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      it->second.handle = handle;
      return it->second;
    }
    tried += fmt::format("\n  {}: {}", path.string(), ::dlerror());
  }
  it->second.error = fmt::format("{} could not be loaded; looked for:{}", library, tried);
  return it->second;
}

}  // namespace

bool plugin_available(const char* library, std::string* why) {
  const Loaded& l = load(library);
  if (l.handle == nullptr && why != nullptr) *why = l.error;
  return l.handle != nullptr;
}

void* plugin_symbol(const char* library, const char* symbol, const char* field) {
  const Loaded& l = load(library);
  if (l.handle == nullptr) {
    throw ConfigError(field, fmt::format("{}. It is built with CUDA (nvcc present, -DDTRAIN_WITH_CUDA=ON) next to "
                                         "the binaries; set DTRAIN_PLUGIN_DIR to its folder, or choose a CPU "
                                         "setting",
                                         l.error));
  }
  ::dlerror();
  void* address = ::dlsym(l.handle, symbol);
  if (address == nullptr) {
    throw ConfigError(field, fmt::format("{} has no symbol '{}' ({}): it comes from another dtrain build; "
                                         "rebuild it with this one",
                                         library, symbol, ::dlerror()));
  }
  return address;
}

int cuda_device_count(std::string* why) {
  if (!plugin_available(kCudaPlugin, why)) return 0;
  auto* count = reinterpret_cast<CudaDeviceCountFn*>(plugin_symbol(kCudaPlugin, kCudaDeviceCountSymbol, "device"));
  return count(why);
}

}  // namespace dtrain
