// sharding::cuda::DeviceEngine: the data-parallel engine of the GPU path,
// ZeRO stage 0 (DDP) only. It owns one rank's parameters, gradients and AdamW
// moments in device memory (device_layout.h: blocks back to back) and the
// 16-bit compute copies of mixed precision, and acts on the model's block
// hooks as sharding::Engine does for stage 0: buckets of consecutive blocks
// (backward order, up to bucket_mb) are all-reduced (avg) as soon as their
// last block's backward ends.
//
// Streams and events: the model and this engine queue their kernels on one
// compute stream. When a bucket's gradients are final, an event is recorded
// on the compute stream and the bucket's all-reduce is queued on the NCCL
// communicator with that event (comm::Op::ready_event): the NCCL stream waits
// for it on the GPU, so the host never waits and backward goes on. The
// communicator's Work completes once the NCCL stream has run the collective
// (the backend polls it), so after finish_backward() kernels queued on the
// compute stream see the reduced gradients.
// Host synchronisation: grad_norm() reads the norm once per step (needed for
// the progress line and the fp16 skip decision); nothing else in a step waits.
//
// The host sharding::Engine stays the source of initialisation and
// checkpoints: the constructor uploads its parameters and moments (so
// initialisation and a resumed state are the CPU's), download_state() copies
// the device state into its owned slices before a save, upload_state() copies
// what a resume loaded into it. The fp16 loss scaler is the host engine's, so
// checkpoints keep its state as on the CPU path.
//
// Threading: one training thread calls everything; the communicator's comm
// thread runs the collectives. The communicator (when given) and the host
// engine must outlive this engine.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "nn/adamw.h"
#include "nn/hooks.h"
#include "nn/loss_scaler.h"
#include "nn/parameters.h"
#include "sharding/cuda/device_layout.h"
#include "sharding/engine.h"

namespace dtrain::sharding::cuda {

struct DeviceEngineOptions {
  double bucket_mb = 25.0;     // parallel.bucket_mb
  DType compute = DType::f32;  // precision: f32, or bf16/f16 compute copies of the masters
  DType reduce = DType::f32;   // parallel.reduce_dtype: gradient collectives' element type
};

class DeviceEngine : public nn::BlockHooks {
 public:
  // `comm`: an nccl communicator whose device is the current one, or null for
  // a single rank (averaging over one rank changes nothing, so no collective
  // runs; 16-bit reduction still rounds the gradients, as the host engine's
  // world of one does). `world_size` pads the bucket plan as the host engine does.
  // Allocates the device buffers and uploads `host`'s state (host.stage() must be 0).
  DeviceEngine(const nn::ParameterLayout& layout, Engine& host, comm::Communicator* comm,
               int world_size, DeviceEngineOptions options, cudaStream_t stream);
  ~DeviceEngine() override;
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  // Device pointers for nn::cuda::Transformer::bind.
  nn::BlockPointers pointers() const;

  // Starts an optimizer step: clears gradients (queued on the stream).
  void begin_step();
  // Whether the coming micro-batch's backward communicates (the last one does).
  void set_sync(bool sync) { sync_ = sync; }

  void after_backward(int block) override;

  // Waits for every gradient collective of the step (the host waits for the
  // comm thread, which has polled NCCL's stream to completion), then widens
  // 16-bit reductions back into the f32 gradients on the compute stream.
  void finish_backward();
  // Global L2 norm of the averaged, unscaled gradients (inf or NaN when they
  // overflowed). Computes the norm and the clipping factor for `max_norm`
  // (optimizer.grad_clip; <= 0: none) on the device, then synchronises the
  // stream to read the norm: the step's one host synchronisation.
  double grad_norm(float max_norm);
  // AdamW with the device-side clipping factor; then refreshes the compute
  // copies. With loss scaling, a non-finite norm skips the update (returns
  // false) and the scaler backs off (REQUIRES grad_norm() this step).
  // `step` is AdamW's t, as in Engine::step.
  bool step(const nn::AdamWHyper& hyper, std::int64_t step);

  // The factor backward multiplies the loss by (the host engine's scaler).
  float loss_scale() const { return static_cast<float>(scaler_.scale()); }

  // Copies the device parameters and moments into host.owned_state() (before a save).
  void download_state(Engine& host);
  // Copies host.state_to_load() (after a resume, or at start) to the device
  // and refreshes the compute copies.
  void upload_state(Engine& host);

  // Device bytes of parameters, gradients, moments, compute copies and staging.
  std::int64_t device_bytes() const;

 private:
  struct Buffers;
  struct Pending {
    comm::Work work;
    std::int64_t offset = 0;  // the bucket's elements in the gradient buffer
    std::int64_t size = 0;
  };
  bool half_compute() const { return options_.compute != DType::f32; }
  bool half_reduce() const { return options_.reduce != DType::f32; }
  float* tensor(StateTensor t);
  void reduce_bucket_ending_at(int block);
  void refresh_compute();

  const nn::ParameterLayout& layout_;
  comm::Communicator* comm_;
  DeviceEngineOptions options_;
  cudaStream_t stream_;
  nn::LossScaler& scaler_;
  std::vector<std::int64_t> offsets_, numel_;
  BucketPlan plan_;
  std::vector<cudaEvent_t> bucket_ready_;  // one per bucket, recorded when its gradients are final
  std::vector<Pending> pending_;
  bool sync_ = true;
  bool norm_taken_ = false;
  double last_norm_ = 0.0;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace dtrain::sharding::cuda
