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

namespace {

// A device that hands out no memory and runs nothing: it only counts the
// bytes asked of it. A graph built on it reports its buffers' sizes; nothing
// may read or write through its pointers.
class CountingDevice final : public Device {
 public:
  std::string name() const override { return "counting"; }
  bool host_memory() const override { return false; }
  bool asynchronous() const override { return false; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(0); }
  void* allocate(std::size_t) override { return &nowhere_; }
  void release(void*) noexcept override {}
  void* allocate_host(std::size_t) override { return &nowhere_; }
  void release_host(void*) noexcept override {}
  void copy(void*, const void*, std::size_t) override {}
  void zero(void*, std::size_t) override {}
  FencePtr fence() override { return nullptr; }
  void wait(const FencePtr&) override {}
  void synchronize() override {}
  void to_half(const float*, std::uint16_t*, DType, std::int64_t) override {}
  void to_f32(const std::uint16_t*, DType, float*, std::int64_t, bool) override {}
  void add(float*, const float*, std::int64_t) override {}
  void sum_of_squares(const float*, std::int64_t, double*) override {}
  void adamw(float*, const float*, float*, float*, std::int64_t, const AdamWHyper&, float, std::int64_t,
             float) override {}
  std::unique_ptr<Model> make_model(const ModelConfig&, const ParameterLayout&, std::int64_t,
                                    std::int64_t) override {
    return nullptr;
  }

 private:
  alignas(64) static inline std::byte nowhere_[64];
};

}  // namespace

std::int64_t planned_activation_bytes(const ModelConfig& config, const ParameterLayout& layout, std::int64_t batch,
                                      std::int64_t seq_len, AttentionScratchKind attention_scratch,
                                      std::int64_t row_pad) {
  CountingDevice counting;
  cpu::HostDevice host;  // the kernels' device: never called while the graph is built
  // Only the storage type changes the sizes; the scratch and other row
  // strides are added on their own.
  auto plan = [&]<class F>(F) {
    const std::int64_t graph = Graph<cpu::HostKernels<F>>(counting, cpu::HostKernels<F>(host), config, layout,
                                                          batch, seq_len)
                                   .activation_bytes();
    using Acts = GraphActivations<typename F::T>;
    using Kernels = cpu::HostKernels<F>;
    const MlpStrides host{Kernels::row_stride(config.fc1_width(), config.d_model),
                          Kernels::row_stride(config.d_ff, config.d_model)};
    const MlpStrides planned = row_pad < 0 ? host : MlpStrides{config.fc1_width() + row_pad, config.d_ff + row_pad};
    return graph + Acts(counting, config, batch, seq_len, attention_scratch, planned).bytes() -
           Acts(counting, config, batch, seq_len, AttentionScratchKind::none, host).bytes();
  };
  return config.compute == DType::f32 ? plan(cpu::F32Format{}) : plan(cpu::Bf16Format{});
}

}  // namespace dtrain::nn
