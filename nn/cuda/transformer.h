// nn::cuda::Transformer: the GPU mirror of nn::Transformer (nn/transformer.h
// gives the models, the parameter layout and the blocks). Same math and
// memory layout, every layer through the nn/cuda kernel beside its CPU one:
// f32, or bf16/f16 compute with 16-bit copies of the weights and 16-bit
// matmul operands, f32 norms, softmax, GELU arithmetic, loss and parameter
// gradients, as the CPU does. Dropout uses the CPU's counter-based masks
// (same keys), so both devices drop the same elements.
//
// Memory: activations, backward scratch and the inputs live in device memory
// allocated once, for micro-batches of `batch` x `seq_len`; the inputs pass
// through two pinned host staging slots (cudaHostAlloc) on their way in.
// Parameters are never owned: bind() takes device pointers per block
// (sharding::cuda::DeviceEngine's buffers).
//
// Streams: everything runs on the stream given at construction, in order.
// forward() and backward() only queue work (the host waits at most for the
// input staging slot it is about to refill: the copy issued two micro-batches
// earlier). The loss sum and correct count accumulate on the device over
// every forward since reset_result(); collect() synchronises the stream and
// reads them once. A target or token outside its range cannot throw from the
// device: tokens are checked on the host while they are staged (a bad token
// would make the embedding's backward write outside its table), targets by
// the device and reported by collect() as DataError naming the row.
//
// Threading: one thread drives a model (it owns a cuBLAS handle). The BlockHooks
// are called around every block exactly as the CPU model calls them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "nn/attention.h"
#include "nn/hooks.h"
#include "nn/parameters.h"
#include "nn/transformer.h"

namespace dtrain::nn::cuda {

class Blas;

class Transformer {
 public:
  // Allocates device activations and pinned staging for `batch` x `seq_len`
  // on the current CUDA device. The stream must outlive the model.
  Transformer(const ModelConfig& config, const ParameterLayout& layout, std::int64_t batch,
              std::int64_t seq_len, cudaStream_t stream);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // REQUIRES: device pointers, one per block (compute too unless config.compute is f32).
  void bind(const BlockPointers& device_pointers);

  // inputs: host memory (the data loader's batch), read before forward returns.
  // training: dropout on (when configured) and state kept for backward.
  // Throws DataError naming the row and position of a token outside the vocabulary.
  void forward(const ModelInputs& inputs, BlockHooks& hooks, bool training, const StepKey& key);
  // Adds d(grad_scale * loss)/d(params) into the bound gradients.
  // REQUIRES: the last call was forward(..., training = true, ...).
  void backward(BlockHooks& hooks, float grad_scale);

  // Clears the device-side loss sum and correct count (queued on the stream).
  void reset_result();
  // Synchronises the stream, then returns the mean loss and the correct and
  // scored counts over every forward since reset_result(). Throws DataError
  // when a target was outside [0, outputs) (the rows after it were still scored).
  ForwardResult collect();

  const ModelConfig& config() const { return config_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t seq_len() const { return seq_; }
  cudaStream_t stream() const { return stream_; }
  // Device bytes of activations, scratch and inputs.
  std::int64_t activation_bytes() const;

 private:
  // Order of a layer block's parameters (declare_parameters keeps it).
  enum LayerParam : int {
    kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFc1W, kFc1B, kFc2W, kFc2B
  };
  // The CPU model's dropout sites (nn::Transformer): 2l, 2l+1 and the embedding's.
  static constexpr std::int64_t kEmbedDropoutSite = 1 << 20;
  struct Activations;
  struct HalfActivations;
  struct Inputs;
  bool half() const { return config_.compute != DType::f32; }
  std::int64_t rows() const { return config_.kind == ModelConfig::Kind::lm ? batch_ * seq_ : batch_; }
  std::uint64_t key_for(const StepKey& key, std::int64_t site) const;
  void stage_inputs(const ModelInputs& inputs);
  void embed_forward(const StepKey& key, bool training);
  void layer_forward(int l, const StepKey& key, bool training);
  void head_forward();
  void head_backward(float grad_scale);
  void layer_backward(int l);
  void embed_backward();
  void layer_forward_half(int l, const StepKey& key, bool training);
  void layer_backward_half(int l);
  void lm_head_forward_half();
  void lm_head_backward_half(float* dlogits);
  float* param(int index, bool grad) const;
  const std::uint16_t* param16(int index) const;

  ModelConfig config_;
  const ParameterLayout& layout_;
  std::int64_t batch_, seq_;
  cudaStream_t stream_;
  AttentionShape attn_shape_;
  BlockPointers ptrs_;
  StepKey key_{};
  bool dropout_active_ = false;
  std::int64_t scored_ = 0;  // rows scored since reset_result()
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<Inputs> inputs_;
  std::unique_ptr<Activations> acts_;
  std::unique_ptr<HalfActivations> half_;
};

}  // namespace dtrain::nn::cuda
