// Gradient collectives, clipping norm and the optimizer step of the engine.
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "sharding/engine_state.h"

namespace dtrain::sharding {
namespace {

constexpr std::size_t as_size(std::int64_t n) { return static_cast<std::size_t>(n); }

}  // namespace

void Engine::Impl::zero_gradients() {
  dev_.zero(grads_.data(), grads_.bytes());
  pending_.clear();
  finished_.clear();
  collectives_this_step_ = 0;
}

void Engine::Impl::start_micro_batch() {
  // The tied head adds into block 0's gradient before block 0's backward.
  if (options_.stage >= 2 && tied_) {
    drain(grad0_slot_);
    dev_.zero(grad_block0_.data(), grad_block0_.bytes());
  }
}

// Queues, behind the reduce-scatter that last used `slot`, the add of its
// result (this rank's slice, averaged over ranks) into the block's gradient shard.
void Engine::Impl::drain(Slot& slot) {
  if (slot.block < 0) return;
  const int b = slot.block;
  after(slot.work);
  finished_.push_back(slot.work);
  const std::int64_t n = shard_[as_size(b)];
  const std::int64_t at = static_cast<std::int64_t>(rank_) * n;
  float* shard = grads_.data() + shard_offset_[as_size(b)];
  if (half_reduce()) {
    dev_.to_f32(staging_buffer(b) + at, options_.reduce, shard, n, /*accumulate=*/true);
  } else {
    dev_.add(shard, gradient_buffer(b) + at, n);
  }
  slot.block = -1;
  slot.work = comm::Work();
}

void Engine::Impl::prepare_gradient_slot(int b) {
  if (tied_ && b == 0) return;  // cleared at the start of the micro-batch
  drain(gradient_slot(b));
  dev_.zero(gradient_buffer(b), as_size(padded_size(numel_[as_size(b)], world_)) * sizeof(float));
}

void Engine::Impl::reduce_scatter_block(int b) {
  Slot& slot = gradient_slot(b);
  float* buffer = gradient_buffer(b);
  const std::int64_t n = shard_[as_size(b)];
  slot.block = b;
  if (half_reduce()) {  // 16-bit on the wire: drain() widens this rank's part
    std::uint16_t* staged = staging_buffer(b);
    dev_.to_half(buffer, staged, options_.reduce, n * world_);
    slot.work = comm_.reduce_scatter(staged, staged + rank_ * n, as_size(n), options_.reduce, comm::ReduceOp::avg,
                                     ready());
  } else {
    slot.work = comm_.reduce_scatter(buffer, buffer + rank_ * n, as_size(n), DType::f32, comm::ReduceOp::avg, ready());
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
      pending_.push_back({comm_.allreduce(grads, as_size(end - begin), DType::f32, comm::ReduceOp::avg, ready())});
      return;
    }
    std::uint16_t* staged = staging_.data() + begin;
    dev_.to_half(grads, staged, type, end - begin);
    pending_.push_back({comm_.allreduce(staged, as_size(end - begin), type, comm::ReduceOp::avg, ready()), staged,
                        grads, end - begin});
    return;
  }
  for (int c = bucket.hi; c >= bucket.lo; --c) {
    const std::int64_t n = shard_[as_size(c)];
    float* grads = full_grads(c);
    if (!half_reduce()) {
      pending_.push_back(
          {comm_.reduce_scatter(grads, grads + rank_ * n, as_size(n), DType::f32, comm::ReduceOp::avg, ready())});
      continue;
    }
    std::uint16_t* staged = staging_.data() + full_offset_[as_size(c)];
    dev_.to_half(grads, staged, type, n * world_);
    pending_.push_back({comm_.reduce_scatter(staged, staged + rank_ * n, as_size(n), type, comm::ReduceOp::avg,
                                             ready()),
                        staged + rank_ * n, grads + rank_ * n, n});
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
    after(p.work);
    if (p.staged != nullptr) dev_.to_f32(p.staged, options_.reduce, p.dst, p.n, /*accumulate=*/false);
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

// Every collective still in flight and every queued kernel: they use our
// buffers. Errors were reported where the work was waited for.
void Engine::Impl::wait_all() noexcept {
  auto quietly = [](auto&& fn) {
    try {
      fn();
    } catch (const std::exception&) {
    }
  };
  for (Pending& p : pending_) quietly([&] { p.work.wait(); });
  for (comm::Work& w : unchecked_) quietly([&] { w.wait(); });
  std::vector<Slot*> slots = gather_slots();
  slots.insert(slots.end(), {&grad_slots_[0], &grad_slots_[1], &grad0_slot_});
  for (Slot* s : slots) {
    if (s->work.valid()) quietly([&] { s->work.wait(); });
  }
  quietly([&] { dev_.synchronize(); });
}

// The device sums each block's squares into this rank's total; stages 1-3
// gather every rank's total (their slices are disjoint) and the host adds
// them in rank order, so every rank gets the same, deterministic sum. The
// host waits for the device once, here.
double Engine::Impl::grad_sum_of_squares() {
  dev_.zero(sum_sq_.data(), sum_sq_.bytes());
  for (int b = 0; b < blocks_; ++b) {
    const Range own = owned_elements(numel_[as_size(b)], world_, rank_);
    if (options_.stage == 0) {
      dev_.sum_of_squares(full_grads(b), numel_[as_size(b)], sum_sq_.data());
    } else if (options_.stage == 1) {
      dev_.sum_of_squares(full_grads(b) + own.offset, own.size, sum_sq_.data());
    } else {
      dev_.sum_of_squares(grads_.data() + shard_offset_[as_size(b)], own.size, sum_sq_.data());
    }
  }
  const int ranks = options_.stage == 0 ? 1 : world_;  // stage 0: every rank holds the same averaged gradients
  if (ranks > 1) {
    after(comm_.allgather(sum_sq_.data(), all_sums_.data(), 2, DType::i32, ready()));  // one double each
    dev_.copy(host_sums_.data(), all_sums_.data(), all_sums_.bytes());
  } else {
    dev_.copy(host_sums_.data(), sum_sq_.data(), sizeof(double));
  }
  dev_.synchronize();
  check_collectives();
  double total = 0.0;
  for (int r = 0; r < ranks; ++r) total += host_sums_.data()[r];
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
    dev_.adamw(p + at, g + at, m + at, v + at, overlap.size, hyper, spec.decay ? hyper.weight_decay : 0.0f, step,
               grad_scale);
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
      gathers.push_back(comm_.allgather(full_params(b) + rank_ * n, full_params(b), as_size(n), DType::f32, ready()));
    }
  }
  for (const comm::Work& w : gathers) after(w);
  if (stage == 3) invalidate_gathers();  // the masters changed: gathered copies are stale
  refresh_compute();
}

}  // namespace dtrain::sharding
