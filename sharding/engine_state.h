// The buffers and bookkeeping behind sharding::Engine (engine.h says what
// each stage keeps). Private to sharding/.
//
// Memory per stage, in the device's memory (B = padded blocks back to back,
// S = this rank's slices):
//   stage 0  params B, grads B, moments 2B
//   stage 1  params B, grads B, moments 2S
//   stage 2  params B, grads S (+ 2 gradient slots of the largest block), moments 2S
//   stage 3  params S (+ 2 gather slots), grads S (+ 2 gradient slots), moments 2S
// With tied embeddings, stages 2-3 give block 0 its own gradient buffer (the
// head adds into it long before block 0's backward) and stage 3 its own
// gather buffer (the head reads it in forward and backward).
// Mixed precision adds 16-bit compute copies (stages 0-2: B; stage 3: 2 slots
// beside the gather slots) and, when gradients travel in 16 bits, staging of
// the gradients' shape (stages 0-1: B; stages 2-3: one per gradient slot).
// A device without host memory (a GPU) adds a host copy of this rank's owned
// state, for checkpoints.
//
// Ordering on the device (nn/device.h): every collective waits for a fence
// at the end of what the device has queued so far (the kernels that produce
// its input and those still reading its output), and device work that reads
// a collective's output is queued behind its done fence (after()). The host
// waits only where it reads: the gradient norm, gather_parameters, the state.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/aligned_buffer.h"
#include "nn/adamw.h"
#include "nn/device.h"
#include "nn/parameters.h"
#include "sharding/engine.h"
#include "sharding/shard_math.h"

namespace dtrain::sharding {

// Elements of each of the engine's buffers (the memory table above) for a
// layout, a world size and options: what the engine allocates, and what a
// dry run reports without allocating.
struct BufferPlan {
  std::size_t params = 0, grads = 0, moments = 0;  // moments: each of exp_avg, exp_avg_sq
  std::size_t gather_slot = 0, gather_block0 = 0, grad_slot = 0, grad_block0 = 0;  // f32
  int gather_slots = 0;  // stage 3: how many gather (and compute) slots; the other slots come in twos
  std::size_t compute = 0, compute_slot = 0, compute_block0 = 0;                   // 16-bit
  std::size_t staging = 0, staging_slot = 0, staging_block0 = 0;                   // 16-bit
  MemoryStats stats() const;
};
BufferPlan plan_buffers(const nn::ParameterLayout& layout, int world, const EngineOptions& options);

struct Engine::Impl {
  Impl(const nn::ParameterLayout& layout, comm::Communicator& comm, nn::Device& device, EngineOptions options);

  MemoryStats memory() const;
  nn::BlockPointers pointers() const;
  void initialise_parameters(std::uint64_t seed);

  void zero_gradients();
  void start_micro_batch();
  // Stage 3: makes block b whole in its gather slot and prefetches the next
  // block in `direction` (+1 forward, -1 backward).
  void gather_for(int b, int direction);
  // Stages 2-3: clears block b's gradient slot once its last reduce-scatter is done.
  void prepare_gradient_slot(int b);
  void reduce_scatter_block(int b);
  void reduce_bucket_ending_at(int b);
  bool first_collective_started() const;
  void wait_gradients();
  double take_gradient_comm_seconds();
  void wait_all() noexcept;
  // Block b's full-size local gradient (before communication), device memory.
  float* local_gradients(int b);
  // Stages 0-2: converts every block's masters into the compute copies;
  // stage 3: forgets which gathered blocks were converted. Every change of
  // the masters ends here, so it also draws a new weights version.
  void refresh_compute();

  // Sum of squares of the averaged gradients over every rank (host; waits for the device).
  double grad_sum_of_squares();
  void optimizer_step(const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale);
  std::vector<float> gather_parameters();
  std::vector<StateSlice> state_slices(bool owned_only);
  // After state_slices(false) was filled: copies a host copy to the device.
  void upload_loaded_state();
  void invalidate_gathers();
  nn::Device& device() { return dev_; }

 private:
  struct Slot {
    int block = -1;       // the block it holds (or is receiving); -1: none
    comm::Work work;      // the collective filling or draining it
    int converted = -1;   // stage 3 gathers: the block whose compute copy is current
  };
  // A gradient collective; with 16-bit reduction, `n` elements of `staged`
  // are widened into `dst` once it completes.
  struct Pending {
    comm::Work work;
    const std::uint16_t* staged = nullptr;
    float* dst = nullptr;
    std::int64_t n = 0;
  };

  float* full_params(int b) { return params_.data() + full_offset_[static_cast<std::size_t>(b)]; }
  float* full_grads(int b) { return grads_.data() + full_offset_[static_cast<std::size_t>(b)]; }
  float* gather_buffer(int b);
  float* gradient_buffer(int b);
  std::uint16_t* compute_buffer(int b);
  std::uint16_t* staging_buffer(int b);  // stages 2-3: beside gradient_buffer(b)
  bool half_compute() const { return options_.compute != DType::f32; }
  bool half_reduce() const { return options_.reduce != DType::f32; }
  void allocate(const BufferPlan& plan);
  Slot& gradient_slot(int b);
  Slot& gather_slot(int b);
  std::vector<Slot*> gather_slots();  // every one, block 0's included
  std::size_t rotating_slot(int b) const;  // stage 3: block b's gather and compute slot (b mod their number)
  void launch_gather(int b);
  void drain(Slot& slot);
  // The fence a collective waits for: the end of the device's queue.
  FencePtr ready();
  // Device work queued from now on runs after `work` completes; its error is
  // rethrown by check_collectives() if not before.
  void after(const comm::Work& work);
  // Rethrows the error of any collective queued work waited for (they are
  // complete once the device has run past them: call after synchronize()).
  void check_collectives();
  void adamw_block(int b, Range range, float* p, const float* g, float* m, float* v,
                   const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale);
  void check_identical(std::uint64_t checksum);
  // The slices of state_slices() in the device's own memory.
  std::vector<StateSlice> device_slices(bool owned_only);

  const nn::ParameterLayout& layout_;
  comm::Communicator& comm_;
  nn::Device& dev_;
  EngineOptions options_;
  BufferPlan plan_;
  int world_;
  int rank_;
  int blocks_;
  bool tied_;
  std::vector<std::int64_t> numel_, shard_, full_offset_, shard_offset_;

  template <class T>
  using Array = nn::DeviceArray<T>;
  Array<float> params_;      // stage 0-2: all blocks padded; stage 3: the slices (masters)
  Array<float> grads_;       // stage 0-1: all blocks padded; stage 2-3: the slices
  Array<float> exp_avg_, exp_avg_sq_;       // stage 0: all blocks; 1-3: the slices
  std::vector<Array<float>> gather_;  // stage 3: plan_.gather_slots of them, block b in b % that
  Array<float> gather_block0_;        // stage 3, tied embeddings
  Array<float> grad_slot_[2], grad_block0_;  // stages 2-3
  std::vector<Slot> gather_slot_;
  Slot gather0_slot_;
  Slot grad_slots_[2], grad0_slot_;
  Array<std::uint16_t> compute_;                             // stages 0-2, mixed precision
  std::vector<Array<std::uint16_t>> compute_slot_;           // stage 3, mixed precision: beside gather_
  Array<std::uint16_t> compute_block0_;                      // stage 3, mixed precision, tied embeddings
  Array<std::uint16_t> staging_;                             // stages 0-1, 16-bit reduction
  Array<std::uint16_t> staging_slot_[2], staging_block0_;    // stages 2-3, 16-bit reduction
  Array<double> sum_sq_;        // this rank's gradient sum of squares
  Array<double> all_sums_;      // every rank's (stages 1-3)
  nn::HostArray<double> host_sums_;
  // BlockPointers::weights_version: a new one for every block at every update.
  std::vector<std::uint64_t> weights_versions_;
  // Devices without host memory: the state a checkpoint saves or loads, on
  // the host (allocated by the first save or resume), and where each piece
  // lives on the device.
  struct Transfer {
    float* device;
    float* host;
    std::int64_t n;
  };
  AlignedBuffer<float> host_state_;
  std::vector<Transfer> transfers_;

  BucketPlan buckets_;                    // stage 0-1
  std::vector<Pending> pending_;          // this step's gradient collectives
  std::vector<comm::Work> finished_;      // drained ones, for timing
  std::vector<comm::Work> unchecked_;     // waited for by the device, not yet by the host
  int collectives_this_step_ = 0;         // for options.testonly_unfenced_collective
};

}  // namespace dtrain::sharding
