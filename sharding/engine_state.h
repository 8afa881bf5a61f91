// The buffers and bookkeeping behind sharding::Engine (engine.h says what
// each stage keeps). Private to sharding/.
//
// Memory per stage (B = padded blocks back to back, S = this rank's slices):
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
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/aligned_buffer.h"
#include "nn/adamw.h"
#include "nn/parameters.h"
#include "sharding/engine.h"
#include "sharding/shard_math.h"

namespace dtrain::sharding {

struct Engine::Impl {
  Impl(const nn::ParameterLayout& layout, comm::Communicator& comm, EngineOptions options);

  MemoryStats memory() const;
  nn::BlockPointers pointers() const;
  void initialise_parameters(std::uint64_t seed);

  void zero_gradients();
  void start_micro_batch();
  // Stage 3: makes block b whole in its gather slot and prefetches the next
  // block in `direction` (+1 forward, -1 backward).
  void gather_for(int b, int direction);
  // Stages 2-3: waits until block b's gradient slot is free, then clears it.
  void prepare_gradient_slot(int b);
  void reduce_scatter_block(int b);
  void reduce_bucket_ending_at(int b);
  bool first_collective_started() const;
  void wait_gradients();
  double take_gradient_comm_seconds();
  void wait_all();
  // Block b's full-size local gradient (before communication).
  float* local_gradients(int b);
  // Stages 0-2: converts every block's masters into the compute copies;
  // stage 3: forgets which gathered blocks were converted. No-op in f32.
  void refresh_compute();

  double grad_sum_of_squares();
  void optimizer_step(const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale);
  std::vector<float> gather_parameters();
  std::vector<StateSlice> state_slices(bool owned_only);
  void invalidate_gathers();

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

  float* full_params(int b) { return params_.data() + full_offset_[b]; }
  float* full_params_ptr(int b, std::int64_t at) { return params_.data() + full_offset_[b] + at; }
  float* full_grads(int b) { return grads_.data() + full_offset_[b]; }
  float* gather_buffer(int b);
  float* gradient_buffer(int b);
  std::uint16_t* compute_buffer(int b);
  std::uint16_t* staging_buffer(int b);  // stages 2-3: beside gradient_buffer(b)
  bool half_compute() const { return options_.compute != DType::f32; }
  bool half_reduce() const { return options_.reduce != DType::f32; }
  void allocate_mixed_precision();
  Slot& gradient_slot(int b);
  void launch_gather(int b);
  void drain(Slot& slot);
  void track(comm::Work work, const std::uint16_t* staged = nullptr, float* dst = nullptr,
             std::int64_t n = 0);
  void adamw_block(int b, Range range, float* p, const float* g, float* m, float* v,
                   const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale);
  void check_identical(std::uint64_t checksum);

  const nn::ParameterLayout& layout_;
  comm::Communicator& comm_;
  EngineOptions options_;
  int world_;
  int rank_;
  int blocks_;
  bool tied_;
  std::vector<std::int64_t> numel_, shard_, full_offset_, shard_offset_;
  std::int64_t max_padded_ = 0;

  AlignedBuffer<float> params_;      // stage 0-2: all blocks padded; stage 3: the slices (masters)
  AlignedBuffer<float> grads_;       // stage 0-1: all blocks padded; stage 2-3: the slices
  AlignedBuffer<float> exp_avg_, exp_avg_sq_;  // stage 0: all blocks; 1-3: the slices
  AlignedBuffer<float> gather_[2], gather_block0_;    // stage 3
  AlignedBuffer<float> grad_slot_[2], grad_block0_;   // stages 2-3
  Slot gather_slot_[2], gather0_slot_;
  Slot grad_slots_[2], grad0_slot_;
  AlignedBuffer<std::uint16_t> compute_;                      // stages 0-2, mixed precision
  AlignedBuffer<std::uint16_t> compute_slot_[2], compute_block0_;  // stage 3, mixed precision
  AlignedBuffer<std::uint16_t> staging_;                      // stages 0-1, 16-bit reduction
  AlignedBuffer<std::uint16_t> staging_slot_[2], staging_block0_;  // stages 2-3, 16-bit reduction

  BucketPlan buckets_;                    // stage 0-1
  std::vector<Pending> pending_;          // this step's gradient collectives
  std::vector<comm::Work> finished_;      // drained ones, for timing
};

}  // namespace dtrain::sharding
