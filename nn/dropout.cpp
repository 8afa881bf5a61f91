#include "nn/dropout.h"

namespace dtrain::nn {

namespace {
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

std::uint64_t dropout_key(std::uint64_t seed, std::int64_t step, std::int64_t micro,
                          std::int64_t site, std::int64_t first_element) {
  std::uint64_t k = splitmix64(seed);
  k = splitmix64(k ^ static_cast<std::uint64_t>(step));
  k = splitmix64(k ^ static_cast<std::uint64_t>(micro));
  // Element i's counter is key + i: offsetting the key makes i global.
  return splitmix64(k ^ static_cast<std::uint64_t>(site)) + static_cast<std::uint64_t>(first_element);
}

void dropout_apply(float* x, std::int64_t n, float p, std::uint64_t key) {
  if (p <= 0.0f) return;
  const auto threshold = static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0);
  const float scale = 1.0f / (1.0f - p);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::uint32_t>(splitmix64(key + static_cast<std::uint64_t>(i)) >> 32);
    x[i] = r >= threshold ? x[i] * scale : 0.0f;
  }
}

}  // namespace dtrain::nn
