// Where sharding::cuda::DeviceEngine keeps a model's training state on the
// GPU, as pure functions on element counts (no CUDA types, so CPU tests check
// them). Each of params, grads, exp_avg and exp_avg_sq is one device buffer
// holding every block back to back without padding, at the parameter
// layout's block offsets (what nn::cuda::adamw_step expects). Stage 0 needs
// no padding: an all-reduce takes any count, and nothing is sliced on the GPU.
// The host sharding::Engine slices the same blocks for checkpoints
// (StateSlice: block, tensor, element range); locate() maps such a slice to
// the device buffer and offset that hold it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "sharding/shard_math.h"

namespace dtrain::sharding::cuda {

// The three tensors a checkpoint holds (StateSlice::tensor names them).
enum class StateTensor : std::uint8_t { params, exp_avg, exp_avg_sq };

// A slice's place in the device buffers: elements [offset, offset + size) of `tensor`'s buffer.
struct DeviceSpan {
  StateTensor tensor = StateTensor::params;
  std::int64_t offset = 0;
  std::int64_t size = 0;
};

// "params" | "exp_avg" | "exp_avg_sq" -> the tensor; anything else is an Error naming it.
inline StateTensor state_tensor(std::string_view name) {
  if (name == "params") return StateTensor::params;
  if (name == "exp_avg") return StateTensor::exp_avg;
  if (name == "exp_avg_sq") return StateTensor::exp_avg_sq;
  throw Error(fmt::format("device state: no tensor '{}' (params, exp_avg, exp_avg_sq)", name));
}

// Block b starts at block_offsets[b] and holds block_numel[b] elements
// (nn::ParameterLayout's block_offset and BlockSpec::numel).
// REQUIRES: range lies inside the block (an Error naming block and range otherwise).
inline DeviceSpan locate(const std::vector<std::int64_t>& block_offsets,
                         const std::vector<std::int64_t>& block_numel, std::string_view tensor,
                         int block, Range range) {
  const auto b = static_cast<std::size_t>(block);
  if (block < 0 || b >= block_offsets.size() || b >= block_numel.size()) {
    throw Error(fmt::format("device state: {} of block {} does not exist ({} blocks)", tensor, block,
                            block_offsets.size()));
  }
  if (range.offset < 0 || range.size < 0 || range.end() > block_numel[b]) {
    throw Error(fmt::format("device state: {} elements [{}, {}) lie outside block {} of {} elements",
                            tensor, range.offset, range.end(), block, block_numel[b]));
  }
  return DeviceSpan{state_tensor(tensor), block_offsets[b] + range.offset, range.size};
}

}  // namespace dtrain::sharding::cuda
