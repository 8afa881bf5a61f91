// The trainer's `device: cuda` path (ZeRO stage 0, one GPU per rank): the
// GPU model (nn/cuda/transformer.h) and engine (sharding/cuda/device_engine.h)
// behind an interface free of CUDA types, so worker/trainer.cpp compiles
// without CUDA. make_cuda_step exists only in builds with CUDA
// (DTRAIN_HAVE_CUDA); the trainer calls it only there.
//
// One optimizer step: begin_step(), micro_batch() for each micro-batch
// (queues copies and kernels; the host does not wait for the GPU), then
// finish_step(), which waits for the gradient all-reduces, reads the loss and
// the gradient norm (the step's one synchronisation) and queues AdamW.
// Evaluation: begin_eval(), eval_batch() per batch, end_eval().
// Threading: the training thread only.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "nn/adamw.h"
#include "nn/parameters.h"
#include "nn/transformer.h"
#include "sharding/engine.h"

namespace dtrain::worker {

struct CudaStepOptions {
  double bucket_mb = 25.0;         // parallel.bucket_mb
  DType reduce = DType::f32;       // parallel.reduce_dtype
  std::int64_t micro_batch = 0;    // rows per micro-batch
  std::int64_t seq_len = 0;
  int world_size = 1;
  // The nccl communicator gradients travel on (its device is the current
  // one); null for a single rank.
  comm::Communicator* device_comm = nullptr;
};

struct CudaStepResult {
  float loss = 0.0f;       // mean over the step's micro-batches
  double grad_norm = 0.0;  // before clipping, unscaled
  bool applied = true;     // false: an fp16 step skipped on overflow
};

class CudaStep {
 public:
  virtual ~CudaStep() = default;

  virtual void begin_step() = 0;
  // inputs: host memory, read before the call returns. sync: this is the
  // step's last micro-batch (its backward all-reduces the gradients).
  // loss_factor: what backward multiplies the loss by (loss scale / accumulation).
  virtual void micro_batch(const nn::ModelInputs& inputs, const nn::StepKey& key, bool sync,
                           float loss_factor) = 0;
  // max_norm: optimizer.grad_clip; adam_step: AdamW's t (1-based).
  virtual CudaStepResult finish_step(const nn::AdamWHyper& hyper, std::int64_t adam_step,
                                     float max_norm) = 0;

  virtual void begin_eval() = 0;
  virtual void eval_batch(const nn::ModelInputs& inputs) = 0;
  // Mean loss, correct and scored counts over the batches since begin_eval().
  virtual nn::ForwardResult end_eval() = 0;

  // The loss scale backward uses (the host engine's fp16 scaler; 1 otherwise).
  virtual float loss_scale() const = 0;
  // Device state -> the host engine's owned slices (before a checkpoint save).
  virtual void download_state(sharding::Engine& host) = 0;
  // The host engine's state -> the device (after a resume).
  virtual void upload_state(sharding::Engine& host) = 0;
  // Device memory held: parameters, gradients, moments, copies, activations.
  virtual std::int64_t device_bytes() const = 0;
};

// Builds the GPU model and engine on the current CUDA device and uploads the
// host engine's state. REQUIRES a CUDA build; the host engine must outlive it.
std::unique_ptr<CudaStep> make_cuda_step(const nn::ModelConfig& model, const nn::ParameterLayout& layout,
                                         sharding::Engine& host, const CudaStepOptions& options);

}  // namespace dtrain::worker
