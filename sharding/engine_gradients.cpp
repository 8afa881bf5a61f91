// Gradient collectives, clipping norm and the optimizer step of the engine.
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/cpu/convert.h"
#include "sharding/engine_state.h"

namespace dtrain::sharding {
namespace {

constexpr std::size_t as_size(std::int64_t n) { return static_cast<std::size_t>(n); }

}  // namespace

void Engine::Impl::zero_gradients() {
  std::memset(grads_.data(), 0, grads_.size() * sizeof(float));
  pending_.clear();
  finished_.clear();
}

void Engine::Impl::start_micro_batch() {
  // The tied head adds into block 0's gradient before block 0's backward.
  if (options_.stage >= 2 && tied_) {
    drain(grad0_slot_);
    std::memset(grad_block0_.data(), 0, grad_block0_.size() * sizeof(float));
  }
}

void Engine::Impl::track(comm::Work work, const std::uint16_t* staged, float* dst, std::int64_t n) {
  pending_.push_back(Pending{std::move(work), staged, dst, n});
}

// Waits for the reduce-scatter that last used `slot` and adds its result (this
// rank's slice, averaged over ranks) into the block's gradient shard.
void Engine::Impl::drain(Slot& slot) {
  if (slot.block < 0) return;
  const int b = slot.block;
  slot.work.wait();
  finished_.push_back(slot.work);
  const std::int64_t at = static_cast<std::int64_t>(rank_) * shard_[as_size(b)];
  float* shard = grads_.data() + shard_offset_[as_size(b)];
  if (half_reduce()) {
    nn::cpu::add_half_to_f32(staging_buffer(b) + at, options_.reduce, shard, shard_[as_size(b)]);
  } else {
    const float* part = gradient_buffer(b) + at;
    for (std::int64_t i = 0; i < shard_[as_size(b)]; ++i) shard[i] += part[i];
  }
  slot.block = -1;
  slot.work = comm::Work();
}

void Engine::Impl::prepare_gradient_slot(int b) {
  if (tied_ && b == 0) return;  // cleared at the start of the micro-batch
  Slot& slot = gradient_slot(b);
  drain(slot);
  std::memset(gradient_buffer(b), 0, as_size(padded_size(numel_[as_size(b)], world_)) * sizeof(float));
}

void Engine::Impl::reduce_scatter_block(int b) {
  Slot& slot = gradient_slot(b);
  float* buffer = gradient_buffer(b);
  const std::int64_t n = shard_[as_size(b)];
  slot.block = b;
  if (half_reduce()) {  // 16-bit on the wire: drain() widens this rank's part
    std::uint16_t* staged = staging_buffer(b);
    nn::cpu::f32_to_half(buffer, options_.reduce, staged, n * world_);
    slot.work = comm_.reduce_scatter(staged, staged + rank_ * n, as_size(n), options_.reduce, comm::ReduceOp::avg);
  } else {
    slot.work = comm_.reduce_scatter(buffer, buffer + rank_ * n, as_size(n), DType::f32, comm::ReduceOp::avg);
  }
  if (pending_.empty()) pending_.push_back(Pending{slot.work});  // the first one: for the overlap check
}

void Engine::Impl::reduce_bucket_ending_at(int b) {
  const Bucket& bucket = buckets_.buckets[as_size(buckets_.bucket_of[as_size(b)])];
  if (bucket.lo != b) return;  // more blocks of this bucket still to come
  const DType type = options_.reduce;
  if (options_.stage == 0) {
    const std::int64_t begin = full_offset_[as_size(bucket.lo)];
    const std::int64_t end = full_offset_[as_size(bucket.hi)] + padded_size(numel_[as_size(bucket.hi)], world_);
    float* grads = grads_.data() + begin;
    if (!half_reduce()) {
      track(comm_.allreduce(grads, as_size(end - begin), DType::f32, comm::ReduceOp::avg));
      return;
    }
    std::uint16_t* staged = staging_.data() + begin;
    nn::cpu::f32_to_half(grads, type, staged, end - begin);
    track(comm_.allreduce(staged, as_size(end - begin), type, comm::ReduceOp::avg), staged, grads, end - begin);
    return;
  }
  for (int c = bucket.hi; c >= bucket.lo; --c) {
    const std::int64_t n = shard_[as_size(c)];
    if (!half_reduce()) {
      track(comm_.reduce_scatter(full_grads(c), full_grads(c) + rank_ * n, as_size(n), DType::f32,
                                 comm::ReduceOp::avg));
      continue;
    }
    std::uint16_t* staged = staging_.data() + full_offset_[as_size(c)];
    nn::cpu::f32_to_half(full_grads(c), type, staged, n * world_);
    track(comm_.reduce_scatter(staged, staged + rank_ * n, as_size(n), type, comm::ReduceOp::avg),
          staged + rank_ * n, full_grads(c) + rank_ * n, n);
  }
}

bool Engine::Impl::first_collective_started() const {
  return !pending_.empty() && pending_.front().work.started();
}

void Engine::Impl::wait_gradients() {
  if (options_.stage >= 2) {
    drain(grad_slots_[0]);
    drain(grad_slots_[1]);
    drain(grad0_slot_);
    pending_.clear();
    return;
  }
  for (Pending& p : pending_) {
    p.work.wait();
    if (p.staged != nullptr) nn::cpu::half_to_f32(p.staged, options_.reduce, p.dst, p.n);
    finished_.push_back(p.work);
  }
  pending_.clear();
}

double Engine::Impl::take_gradient_comm_seconds() {
  double s = 0.0;
  for (const auto& w : finished_) s += w.run_seconds();
  finished_.clear();
  return s;
}

void Engine::Impl::wait_all() {
  for (Pending& p : pending_) p.work.wait();
  for (Slot* s : {&grad_slots_[0], &grad_slots_[1], &grad0_slot_, &gather_slot_[0], &gather_slot_[1], &gather0_slot_}) {
    if (s->work.valid()) s->work.wait();
  }
}

double Engine::Impl::grad_sum_of_squares() {
  double local = 0.0;
  for (int b = 0; b < blocks_; ++b) {
    const Range own = owned_elements(numel_[as_size(b)], world_, rank_);
    if (options_.stage == 0) {
      local += nn::sum_of_squares(full_grads(b), numel_[as_size(b)]);
    } else if (options_.stage == 1) {
      local += nn::sum_of_squares(full_grads(b) + own.offset, own.size);
    } else {
      local += nn::sum_of_squares(grads_.data() + shard_offset_[as_size(b)], own.size);
    }
  }
  if (options_.stage == 0) return local;  // every rank holds the same averaged gradients
  float total = static_cast<float>(local);
  comm_.allreduce(&total, 1, DType::f32, comm::ReduceOp::sum).wait();
  return total;
}

// AdamW over `range` of block b (block-relative elements); the pointers are
// those of element range.offset. Weight decay follows each parameter's flag.
void Engine::Impl::adamw_block(int b, Range range, float* p, const float* g, float* m, float* v,
                               const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale) {
  const auto& block = layout_.blocks()[as_size(b)];
  for (int i = block.first_param; i < block.first_param + block.num_params; ++i) {
    const nn::ParamSpec& spec = layout_.params()[as_size(i)];
    const Range overlap = intersect(range, Range{spec.offset, spec.numel});
    if (overlap.size == 0) continue;
    const std::int64_t at = overlap.offset - range.offset;
    nn::adamw_update(p + at, g + at, m + at, v + at, overlap.size, hyper,
                     spec.decay ? hyper.weight_decay : 0.0f, step, grad_scale);
  }
}

void Engine::Impl::optimizer_step(const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale) {
  const int stage = options_.stage;
  std::vector<comm::Work> gathers;
  for (int b = 0; b < blocks_; ++b) {
    const std::size_t bi = as_size(b);
    if (stage == 0) {
      adamw_block(b, Range{0, numel_[bi]}, full_params(b), full_grads(b), exp_avg_.data() + full_offset_[bi],
                  exp_avg_sq_.data() + full_offset_[bi], hyper, step, grad_scale);
      continue;
    }
    const Range own = owned_elements(numel_[bi], world_, rank_);
    float* m = exp_avg_.data() + shard_offset_[bi];
    float* v = exp_avg_sq_.data() + shard_offset_[bi];
    const float* g = stage == 1 ? full_grads(b) + own.offset : grads_.data() + shard_offset_[bi];
    float* p = stage == 3 ? params_.data() + shard_offset_[bi] : full_params(b) + own.offset;
    if (own.size > 0) adamw_block(b, own, p, g, m, v, hyper, step, grad_scale);
    if (stage < 3) {
      const std::int64_t n = shard_[bi];
      gathers.push_back(comm_.allgather(full_params(b) + rank_ * n, full_params(b), as_size(n), DType::f32));
    }
  }
  for (auto& w : gathers) w.wait();
  if (stage == 3) invalidate_gathers();  // the masters changed: gathered copies are stale
  refresh_compute();
}

}  // namespace dtrain::sharding
