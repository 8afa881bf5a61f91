// The Transformer on the GPU: nn::Graph over CudaKernels for each compute type.
#include "nn/cuda/cuda_device.h"
#include "nn/cuda/cuda_kernels.h"
#include "nn/graph_backward.h"
#include "nn/graph_forward.h"

namespace dtrain::nn::cuda {

// Graph<CudaKernels<F>> for the format F of config.compute (the engine
// refused any other compute type before a model is made).
std::unique_ptr<Model> CudaDevice::make_model(const ModelConfig& config, const ParameterLayout& layout,
                                              std::int64_t batch, std::int64_t seq_len) {
  make_current();
  auto graph = [&](auto format) -> std::unique_ptr<Model> {
    using Kernels = CudaKernels<decltype(format)>;
    return std::make_unique<Graph<Kernels>>(*this, Kernels(*this), config, layout, batch, seq_len);
  };
  if (config.compute == DType::f32) return graph(cpu::F32Format{});
  return cpu::with_half_format(config.compute, graph);
}

}  // namespace dtrain::nn::cuda

// Every precision's graph, compiled here once.
template class dtrain::nn::Graph<dtrain::nn::cuda::CudaKernels<dtrain::nn::cpu::F32Format>>;
template class dtrain::nn::Graph<dtrain::nn::cuda::CudaKernels<dtrain::nn::cpu::Bf16Format>>;
template class dtrain::nn::Graph<dtrain::nn::cuda::CudaKernels<dtrain::nn::cpu::F16Format>>;
