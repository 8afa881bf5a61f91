// When CPU kernels split work across OpenMP threads.
#pragma once

#include <cstdint>

namespace dtrain::nn {

// Elements below which a kernel stays on one thread: waking a team costs
// microseconds, and on a loaded machine a descheduled team member stalls the
// whole region, so small tensors are faster serial.
inline constexpr std::int64_t kParallelMin = std::int64_t{1} << 16;

}  // namespace dtrain::nn
