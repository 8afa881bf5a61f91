// sharding::Engine: the data-parallel engine (docs/ARCHITECTURE.md, "Core abstractions").
// It owns the parameters, gradients and AdamW state of one rank for a ZeRO
// stage, hands the model per-block views (pointers()), and acts on the
// model's block hooks:
//   stage 0 (DDP)  full params, grads, moments; buckets of consecutive blocks
//                  (backward order, up to bucket_mb) are all-reduced (avg) as
//                  soon as their last block's backward ends.
//   stage 1        moments only for the owned slice; per-block gradients are
//                  reduce-scattered (avg) per bucket, the owned slices updated,
//                  and the updated parameters all-gathered.
//   stage 2        as 1, and full-size gradients exist only transiently: two
//                  rotating block buffers, reduce-scattered into a gradient
//                  shard after every micro-batch.
//   stage 3        as 2, and parameters are sharded too: a block is gathered
//                  before its forward and its backward (the next block is
//                  prefetched while this one computes) and released after.
// Mixed precision (options.compute bf16 or f16): the f32 parameters above are
// the masters; the model computes with 16-bit copies of them (pointers().compute),
// refreshed from the masters after every optimizer step and every load (stage
// 3: the gathered f32 block is converted into a rotating 16-bit slot).
// Gradients stay f32 here; options.reduce picks the type they are
// communicated in (converted just before each collective and back after it).
// With loss scaling (fp16), backward multiplies the loss by loss_scale();
// grad_norm() and step() unscale, and step() skips the update when the
// reduced gradients hold an inf or NaN (every rank sees the same norm, so every
// rank skips together).
//
// Gradient accumulation: set_sync(false) for all micro-batches but the last
// (stages 0 and 1 then communicate once, after the last; stages 2 and 3
// reduce-scatter every micro-batch into the shard).
//
// Devices: every buffer lives in the memory of the engine's nn::Device (the
// host, or a GPU) and every update runs there (nn/device.h), so the same
// engine serves every device; the communicator must move that memory (gloo
// or mpi for the host, nccl for a GPU). Work on the device is asynchronous:
// each collective waits for a fence of the device's queue, and the device's
// later work waits for the collective's done fence, so the host never waits
// for the device inside a step except where it reads: grad_norm() (the norm;
// the trainer reads the loss there too), gather_parameters() and the state.
//
// Threading: one training thread calls everything; collectives run on the
// communicator's comm thread. The communicator and the device must outlive
// the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/aligned_buffer.h"
#include "nn/adamw.h"
#include "nn/device.h"
#include "nn/hooks.h"
#include "nn/loss_scaler.h"
#include "nn/parameters.h"
#include "sharding/shard_math.h"

namespace dtrain::sharding {

struct EngineOptions {
  int stage = 0;                  // parallel.zero_stage
  double bucket_mb = 25.0;        // parallel.bucket_mb
  double first_bucket_mb = 1.0;   // parallel.first_bucket_mb: the first bucket in backward order
  double max_live_mb = 4000.0;    // parallel.zero3_max_live_mb: stage 3's gather slots, at least two
  bool tied_embeddings = false;   // the head reads block 0 (it must stay gathered in stage 3)
  std::uint64_t seed = 0;         // parameter initialisation
  DType compute = DType::f32;     // precision: f32, or bf16/f16 compute copies of the masters
  DType reduce = DType::f32;      // parallel.reduce_dtype: gradient collectives' element type
  nn::LossScalerOptions loss_scaling;  // enabled for precision fp16
  // TEST ONLY: the collective of this index within each step (0 = the first)
  // is queued without waiting for the device's fence, to prove that a missing
  // wait is caught; -1: none.
  int testonly_unfenced_collective = -1;
};

// Bytes this rank holds, by kind (what the ZeRO paper counts as model states,
// plus the working buffers it needs on top).
struct MemoryStats {
  std::int64_t param_bytes = 0;      // parameters kept across steps (full or shard)
  std::int64_t grad_bytes = 0;       // gradients kept across steps (full or shard)
  std::int64_t optimizer_bytes = 0;  // AdamW moments
  std::int64_t working_bytes = 0;    // transient block buffers (gathers, gradient slots)
  int gather_slots = 0;              // stage 3: blocks kept gathered at once (parallel.zero3_max_live_mb)
  std::int64_t model_state_bytes() const { return param_bytes + grad_bytes + optimizer_bytes; }
};

// Communication of the last step, for benchmarks and tests.
struct CommStats {
  double comm_seconds = 0.0;         // time the gradient collectives ran on the comm thread
  double exposed_seconds = 0.0;      // time the training thread waited for them after backward
  bool overlapped = false;           // the first bucket's collective started before backward ended
  // Share of gradient communication hidden behind backward: 1 - exposed/comm.
  double hidden_share() const {
    return comm_seconds > 0.0 ? std::max(0.0, 1.0 - exposed_seconds / comm_seconds) : 1.0;
  }
};

// A contiguous piece of this rank's training state, for checkpoints: elements
// [range.offset, range.end()) of block `block`'s unpadded flat range of one
// tensor ("params", "exp_avg" or "exp_avg_sq").
struct StateSlice {
  const char* tensor = "";
  int block = 0;
  Range range;
  float* data = nullptr;
};

class Engine : public nn::BlockHooks {
 public:
  // Allocates this rank's buffers on `device`, initialises the parameters
  // (identically on every rank: init depends on (seed, parameter index)
  // only), then checks every rank holds the same parameters (a checksum
  // all-gather; stage 0-2 broadcast from rank 0 first).
  Engine(const nn::ParameterLayout& layout, comm::Communicator& comm, nn::Device& device, EngineOptions options);
  ~Engine() override;

  // What the model binds to: per-block parameter and gradient pointers in the
  // device's memory. Valid for the engine's lifetime (stage 3 points into
  // rotating gather buffers that hold the block while its hooks say so).
  nn::BlockPointers pointers() const;

  // Starts an optimizer step: clears gradients.
  void begin_step();
  // Whether the coming micro-batch's backward communicates (the last one does).
  void set_sync(bool sync) { sync_ = sync; }

  void before_forward(int block) override;
  void after_forward(int block) override;
  void before_backward(int block) override;
  void after_backward(int block) override;

  // Waits for every gradient collective of the step; gradients are then
  // averaged over ranks (full on stage 0, the owned slices otherwise).
  void finish_backward();
  // Global L2 norm of the averaged, unscaled gradients (identical on every
  // rank; inf or NaN when they overflowed).
  double grad_norm();
  // AdamW on the owned parameters with the clipping factor fused; then the
  // parameters every rank needs are made whole again (all-gather, stage 1-2)
  // and the compute copies refreshed. With loss scaling, grad_norm() must have
  // been called this step: a non-finite norm skips the update (returns false)
  // and the scaler backs off. `step` is AdamW's t (bias correction): the
  // trainer passes the count of applied updates, so a skipped step does not
  // advance it (as with PyTorch's GradScaler); the LR schedule still advances.
  bool step(const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale);

  // The factor backward multiplies the loss by (1 without loss scaling).
  float loss_scale() const { return static_cast<float>(scaler_.scale()); }
  nn::LossScaler& loss_scaler() { return scaler_; }
  const nn::LossScaler& loss_scaler() const { return scaler_; }

  // For tests: called in after_backward(block), before any communication,
  // with this rank's local f32 gradient of the block (numel elements; the
  // engine then reduces whatever the hook left there). Empty: none.
  // REQUIRES a device with host memory (the engine waits for it first).
  using GradientHook = std::function<void(int block, float* grads, std::int64_t numel)>;
  void set_gradient_hook(GradientHook hook) { gradient_hook_ = std::move(hook); }

  // Every parameter, gathered, in layout order without padding (all ranks
  // take part). For tests, checkpoints and exports.
  std::vector<float> gather_parameters();

  // What this rank saves: its owned slice of every block, for the parameters
  // (fp32 masters) and both moments, whatever the stage, so the ranks write
  // disjoint pieces in parallel. Host memory (a copy, for a device without
  // host memory); waits for the device. Pointers stay valid until the next
  // step() or state call.
  std::vector<StateSlice> owned_state();
  // What this rank must load to resume, in any stage and world size (full
  // blocks where the stage keeps full copies), in host memory. Fill every
  // slice, then call state_loaded() (which copies them to the device).
  std::vector<StateSlice> state_to_load();
  void state_loaded();

  // What an engine of `world` ranks would hold per rank, without allocating
  // (a dry run's figures; memory() of the engine it would build).
  static MemoryStats plan_memory(const nn::ParameterLayout& layout, int world, const EngineOptions& options);

  int stage() const { return options_.stage; }
  const nn::ParameterLayout& layout() const { return layout_; }
  const MemoryStats& memory() const { return memory_; }
  const CommStats& comm_stats() const { return comm_stats_; }
  comm::Communicator& communicator() { return comm_; }
  nn::Device& device();

 private:
  struct Impl;
  const nn::ParameterLayout& layout_;
  comm::Communicator& comm_;
  EngineOptions options_;
  bool sync_ = true;
  MemoryStats memory_;
  CommStats comm_stats_;
  nn::LossScaler scaler_;
  double last_norm_ = 0.0;
  bool norm_taken_ = false;  // grad_norm() ran since begin_step()
  GradientHook gradient_hook_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::sharding
