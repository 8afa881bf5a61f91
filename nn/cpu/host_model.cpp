// The Transformer on the CPU: nn::Graph over HostKernels for each compute type.
#include <fmt/format.h>

#include "core/error.h"
#include "nn/cpu/host_device.h"
#include "nn/cpu/host_kernels.h"
#include "nn/graph_backward.h"
#include "nn/graph_forward.h"

namespace dtrain::nn {

template class Graph<cpu::HostKernels<cpu::F32Format>>;
template class Graph<cpu::HostKernels<cpu::Bf16Format>>;
template class Graph<cpu::HostKernels<cpu::F16Format>>;

namespace cpu {

std::unique_ptr<Model> HostDevice::make_model(const ModelConfig& config, const ParameterLayout& layout,
                                              std::int64_t batch, std::int64_t seq_len) {
  switch (config.compute) {
    case DType::f32:
      return std::make_unique<Graph<HostKernels<F32Format>>>(*this, HostKernels<F32Format>(*this), config, layout,
                                                              batch, seq_len);
    case DType::bf16:
      return std::make_unique<Graph<HostKernels<Bf16Format>>>(*this, HostKernels<Bf16Format>(*this), config,
                                                               layout, batch, seq_len);
    case DType::f16:
      return std::make_unique<Graph<HostKernels<F16Format>>>(*this, HostKernels<F16Format>(*this), config, layout,
                                                              batch, seq_len);
    default:
      throw ConfigError("precision", fmt::format("{} is not a compute type (fp32, bf16, fp16)",
                                                 dtype_name(config.compute)));
  }
}

}  // namespace cpu
}  // namespace dtrain::nn
