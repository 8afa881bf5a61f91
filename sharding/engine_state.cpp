// Buffers, initialisation, the stage-3 parameter gathers and the state that
// checkpoints read and write.
#include "sharding/engine_state.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::sharding {
namespace {

constexpr std::size_t as_size(std::int64_t n) { return static_cast<std::size_t>(n); }

// FNV-1a over the bytes of a float range: cheap, order-sensitive, exact.
std::uint64_t fnv1a(const float* data, std::int64_t n, std::uint64_t h) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < as_size(n) * sizeof(float); ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;
  }
  return h;
}

constexpr std::uint64_t kFnvBasis = 14695981039346656037ull;

}  // namespace

MemoryStats BufferPlan::stats() const {
  MemoryStats m;
  m.param_bytes = static_cast<std::int64_t>(params * sizeof(float));
  m.grad_bytes = static_cast<std::int64_t>(grads * sizeof(float));
  m.optimizer_bytes = static_cast<std::int64_t>(2 * moments * sizeof(float));
  const auto slots = static_cast<std::size_t>(gather_slots);
  const std::size_t f32 = slots * gather_slot + 2 * grad_slot + gather_block0 + grad_block0;
  const std::size_t half =
      compute + slots * compute_slot + 2 * staging_slot + compute_block0 + staging + staging_block0;
  m.working_bytes = static_cast<std::int64_t>(f32 * sizeof(float) + half * sizeof(std::uint16_t));
  m.gather_slots = gather_slots;
  return m;
}

BufferPlan plan_buffers(const nn::ParameterLayout& layout, int world, const EngineOptions& o) {
  std::size_t full = 0, sharded = 0, max_padded = 0;
  for (const nn::BlockSpec& b : layout.blocks()) {
    full += as_size(padded_size(b.numel, world));
    sharded += as_size(shard_size(b.numel, world));
    max_padded = std::max(max_padded, as_size(padded_size(b.numel, world)));
  }
  const std::size_t block0 = o.tied_embeddings ? as_size(padded_size(layout.blocks()[0].numel, world)) : 0;
  const bool half_compute = o.compute != DType::f32, half_reduce = o.reduce != DType::f32;
  const int stage = o.stage;
  BufferPlan p;
  p.params = stage == 3 ? sharded : full;
  p.grads = stage >= 2 ? sharded : full;
  p.moments = stage == 0 ? full : sharded;
  if (stage >= 2) {
    p.grad_slot = max_padded;
    p.grad_block0 = block0;
  }
  if (stage == 3) {
    p.gather_slot = max_padded;
    p.gather_block0 = block0;
    // As many blocks as max_live_mb holds, never fewer than two (one computed
    // while the next arrives), never more than there are blocks.
    const double fit = o.max_live_mb * 1024.0 * 1024.0 / static_cast<double>(max_padded * sizeof(float));
    p.gather_slots = static_cast<int>(std::clamp(fit, 2.0, static_cast<double>(std::max(2, layout.num_blocks()))));
  }
  if (half_compute) {
    p.compute = stage < 3 ? full : 0;
    p.compute_slot = stage == 3 ? max_padded : 0;
    p.compute_block0 = stage == 3 ? block0 : 0;
  }
  if (half_reduce) {
    p.staging = stage < 2 ? full : 0;
    p.staging_slot = stage >= 2 ? max_padded : 0;
    p.staging_block0 = stage >= 2 ? block0 : 0;
  }
  return p;
}

Engine::Impl::Impl(const nn::ParameterLayout& layout, comm::Communicator& comm, nn::Device& device,
                   EngineOptions options)
    : layout_(layout),
      comm_(comm),
      dev_(device),
      options_(options),
      plan_(plan_buffers(layout, comm.world_size(), options)),
      world_(comm.world_size()),
      rank_(comm.rank()),
      blocks_(layout.num_blocks()),
      tied_(options.tied_embeddings) {
  std::int64_t full = 0, sharded = 0;
  for (int b = 0; b < blocks_; ++b) {
    const std::int64_t n = layout.blocks()[as_size(b)].numel;
    numel_.push_back(n);
    shard_.push_back(shard_size(n, world_));
    full_offset_.push_back(full);
    shard_offset_.push_back(sharded);
    full += padded_size(n, world_);
    sharded += shard_size(n, world_);
  }
  allocate(plan_);
  for (int b = 0; b < blocks_; ++b) weights_versions_.push_back(nn::next_weights_version());
  std::vector<std::int64_t> padded;
  for (const std::int64_t n : numel_) padded.push_back(padded_size(n, world_));
  buckets_ = plan_buckets(padded, options.first_bucket_mb,
                          bucket_limit_mb(padded, options.first_bucket_mb, options.bucket_mb));
}

void Engine::Impl::allocate(const BufferPlan& p) {
  using F32 = Array<float>;
  using Half = Array<std::uint16_t>;
  params_ = F32(dev_, p.params);
  grads_ = F32(dev_, p.grads);
  exp_avg_ = F32(dev_, p.moments);
  exp_avg_sq_ = F32(dev_, p.moments);
  for (int i = 0; i < 2; ++i) {
    grad_slot_[i] = F32(dev_, p.grad_slot);
    staging_slot_[i] = Half(dev_, p.staging_slot);
  }
  gather_slot_.resize(as_size(p.gather_slots));
  for (int i = 0; i < p.gather_slots; ++i) {
    gather_.push_back(F32(dev_, p.gather_slot));
    compute_slot_.push_back(Half(dev_, p.compute_slot));
  }
  grad_block0_ = F32(dev_, p.grad_block0);
  gather_block0_ = F32(dev_, p.gather_block0);
  compute_ = Half(dev_, p.compute);
  compute_block0_ = Half(dev_, p.compute_block0);
  staging_ = Half(dev_, p.staging);
  staging_block0_ = Half(dev_, p.staging_block0);
  sum_sq_ = Array<double>(dev_, 1);
  all_sums_ = Array<double>(dev_, as_size(world_));
  host_sums_ = nn::HostArray<double>(dev_, as_size(world_));
}

std::uint16_t* Engine::Impl::compute_buffer(int b) {
  if (options_.stage < 3) return compute_.data() + full_offset_[as_size(b)];
  if (tied_ && b == 0) return compute_block0_.data();
  return compute_slot_[rotating_slot(b)].data();
}

std::uint16_t* Engine::Impl::staging_buffer(int b) {
  if (tied_ && b == 0) return staging_block0_.data();
  return staging_slot_[b % 2].data();
}

float* Engine::Impl::local_gradients(int b) {
  return options_.stage >= 2 ? gradient_buffer(b) : full_grads(b);
}

void Engine::Impl::refresh_compute() {
  // One per block: stage 3's slots hold block after block at one address,
  // and cpu::gemm_weights tells their copies apart by version alone.
  for (std::uint64_t& v : weights_versions_) v = nn::next_weights_version();
  if (!half_compute()) return;
  if (options_.stage == 3) {
    for (Slot* s : gather_slots()) s->converted = -1;
    return;
  }
  for (int b = 0; b < blocks_; ++b) dev_.to_half(full_params(b), compute_buffer(b), options_.compute, numel_[as_size(b)]);
}

MemoryStats Engine::Impl::memory() const { return plan_.stats(); }

float* Engine::Impl::gather_buffer(int b) {
  if (tied_ && b == 0) return gather_block0_.data();
  return gather_[rotating_slot(b)].data();
}

float* Engine::Impl::gradient_buffer(int b) {
  if (tied_ && b == 0) return grad_block0_.data();
  return grad_slot_[b % 2].data();
}

Engine::Impl::Slot& Engine::Impl::gradient_slot(int b) { return tied_ && b == 0 ? grad0_slot_ : grad_slots_[b % 2]; }

Engine::Impl::Slot& Engine::Impl::gather_slot(int b) {
  return tied_ && b == 0 ? gather0_slot_ : gather_slot_[rotating_slot(b)];
}

std::size_t Engine::Impl::rotating_slot(int b) const {
  DTRAIN_CHECK(plan_.gather_slots > 0, "block {}: gather slots exist at stage 3 only", b);
  return as_size(b % plan_.gather_slots);
}

std::vector<Engine::Impl::Slot*> Engine::Impl::gather_slots() {
  std::vector<Slot*> all{&gather0_slot_};
  for (Slot& s : gather_slot_) all.push_back(&s);
  return all;
}

nn::BlockPointers Engine::Impl::pointers() const {
  auto* self = const_cast<Impl*>(this);
  nn::BlockPointers p;
  for (int b = 0; b < blocks_; ++b) {
    p.params.push_back(options_.stage == 3 ? self->gather_buffer(b) : self->full_params(b));
    p.grads.push_back(options_.stage >= 2 ? self->gradient_buffer(b) : self->full_grads(b));
    if (half_compute()) p.compute.push_back(self->compute_buffer(b));
  }
  p.weights_version = weights_versions_.data();
  return p;
}

FencePtr Engine::Impl::ready() {
  const bool skip = collectives_this_step_++ == options_.testonly_unfenced_collective;
  return skip ? nullptr : dev_.fence();
}

void Engine::Impl::after(const comm::Work& work) {
  dev_.wait(work.done_fence());
  unchecked_.push_back(work);
}

void Engine::Impl::check_collectives() {
  for (comm::Work& w : unchecked_) w.wait();
  unchecked_.clear();
}

// Every rank initialises identically (values depend on seed and parameter
// index only, computed on the host block by block); stages 0-2 still
// broadcast rank 0's parameters, and every stage compares checksums so a
// divergent rank is caught before step 1.
void Engine::Impl::initialise_parameters(std::uint64_t seed) {
  const auto& specs = layout_.params();
  std::uint64_t checksum = kFnvBasis;
  AlignedBuffer<float> block(as_size(*std::max_element(numel_.begin(), numel_.end())));
  for (int b = 0; b < blocks_; ++b) {
    const auto& spec = layout_.blocks()[as_size(b)];
    for (int i = spec.first_param; i < spec.first_param + spec.num_params; ++i) {
      nn::init_parameter(specs[as_size(i)], i, seed, block.data() + specs[as_size(i)].offset);
    }
    const std::size_t n = as_size(numel_[as_size(b)]);
    if (options_.stage == 3) {
      const Range own = owned_elements(numel_[as_size(b)], world_, rank_);
      dev_.copy(params_.data() + shard_offset_[as_size(b)], block.data() + own.offset, as_size(own.size) * sizeof(float));
      checksum = fnv1a(block.data(), numel_[as_size(b)], checksum);
    } else {
      dev_.copy(full_params(b), block.data(), n * sizeof(float));
    }
    dev_.synchronize();  // `block` is refilled next
  }
  if (options_.stage < 3) {
    after(comm_.broadcast(params_.data(), params_.size(), DType::f32, 0, dev_.fence()));
    AlignedBuffer<float> all(params_.size());
    dev_.copy(all.data(), params_.data(), params_.bytes());
    dev_.synchronize();
    check_collectives();
    checksum = fnv1a(all.data(), static_cast<std::int64_t>(all.size()), checksum);
  }
  check_identical(checksum);
  refresh_compute();
}

void Engine::Impl::check_identical(std::uint64_t checksum) {
  // Through device memory: the communicator moves the device's buffers.
  static_assert(sizeof(double) == sizeof(std::uint64_t));
  std::memcpy(host_sums_.data(), &checksum, sizeof checksum);
  dev_.copy(sum_sq_.data(), host_sums_.data(), sizeof checksum);
  after(comm_.allgather(sum_sq_.data(), all_sums_.data(), 2, DType::i32, dev_.fence()));
  dev_.copy(host_sums_.data(), all_sums_.data(), all_sums_.bytes());
  dev_.synchronize();
  check_collectives();
  std::vector<std::uint64_t> all(as_size(world_));
  std::memcpy(all.data(), host_sums_.data(), all.size() * sizeof(std::uint64_t));
  for (int r = 0; r < world_; ++r) {
    if (all[as_size(r)] != all[0]) {
      throw CommError(fmt::format(
          "rank {}'s initial parameters differ from rank 0's (checksum {:016x} vs {:016x}): every rank "
          "must run the same dtrain build with the same model config and seed",
          r, all[as_size(r)], all[0]));
    }
  }
}

void Engine::Impl::launch_gather(int b) {
  Slot& slot = gather_slot(b);
  if (slot.block == b) return;  // already there or on its way
  slot.block = b;
  slot.converted = -1;
  // The fence covers the kernels still reading the slot's previous block.
  slot.work = comm_.allgather(params_.data() + shard_offset_[as_size(b)], gather_buffer(b),
                              as_size(shard_[as_size(b)]), DType::f32, ready());
  unchecked_.push_back(slot.work);
}

void Engine::Impl::gather_for(int b, int direction) {
  launch_gather(b);
  const int next = b + direction;
  if (next >= 0 && next < blocks_) launch_gather(next);  // overlaps block b's compute
  Slot& slot = gather_slot(b);
  after(slot.work);
  if (half_compute() && slot.converted != b) {  // the gathered block is what gets converted
    dev_.to_half(gather_buffer(b), compute_buffer(b), options_.compute, numel_[as_size(b)]);
    slot.converted = b;
  }
}

std::vector<float> Engine::Impl::gather_parameters() {
  std::vector<float> out(as_size(layout_.total_numel()));
  std::int64_t at = 0;
  for (int b = 0; b < blocks_; ++b) {
    const float* block = full_params(b);
    if (options_.stage == 3) {
      launch_gather(b);
      after(gather_slot(b).work);
      block = gather_buffer(b);
    }
    dev_.copy(out.data() + at, block, as_size(numel_[as_size(b)]) * sizeof(float));
    dev_.synchronize();  // before the slot is gathered into again
    at += numel_[as_size(b)];
  }
  check_collectives();
  return out;
}

// Slices of params / exp_avg / exp_avg_sq per block. owned_only: this rank's
// owned elements (saving); otherwise whatever this stage keeps (loading):
// stage 0 everything, stages 1-2 full parameters and owned moments, stage 3
// owned parameters and moments.
std::vector<StateSlice> Engine::Impl::device_slices(bool owned_only) {
  std::vector<StateSlice> out;
  const int stage = options_.stage;
  for (int b = 0; b < blocks_; ++b) {
    const std::size_t bi = as_size(b);
    const Range own = owned_elements(numel_[bi], world_, rank_);
    const Range all{0, numel_[bi]};
    const bool full_params = stage < 3 && !owned_only;
    const bool full_moments = stage == 0 && !owned_only;
    float* p = stage == 3 ? params_.data() + shard_offset_[bi] : this->full_params(b) + (full_params ? 0 : own.offset);
    const std::int64_t moments_at = stage == 0 ? full_offset_[bi] + (full_moments ? 0 : own.offset) : shard_offset_[bi];
    out.push_back({"params", b, full_params ? all : own, p});
    out.push_back({"exp_avg", b, full_moments ? all : own, exp_avg_.data() + moments_at});
    out.push_back({"exp_avg_sq", b, full_moments ? all : own, exp_avg_sq_.data() + moments_at});
  }
  return out;
}

// On a device without host memory the slices point into a host copy: filled
// from the device for a save, copied to the device by upload_loaded_state()
// after a load.
std::vector<StateSlice> Engine::Impl::state_slices(bool owned_only) {
  std::vector<StateSlice> slices = device_slices(owned_only);
  transfers_.clear();
  if (!dev_.host_memory()) {
    std::size_t total = 0;
    for (const StateSlice& s : slices) total += as_size(s.range.size);
    if (host_state_.size() < total) host_state_ = AlignedBuffer<float>(total);
    std::size_t at = 0;
    for (StateSlice& s : slices) {
      float* host = host_state_.data() + at;
      transfers_.push_back({s.data, host, s.range.size});
      if (owned_only && s.range.size > 0) dev_.copy(host, s.data, as_size(s.range.size) * sizeof(float));
      s.data = host;
      at += as_size(s.range.size);
    }
  }
  dev_.synchronize();  // the device is done with the state (and, saving, with the copy)
  check_collectives();
  return slices;
}

void Engine::Impl::upload_loaded_state() {
  for (const Transfer& t : transfers_) {
    if (t.n > 0) dev_.copy(t.device, t.host, as_size(t.n) * sizeof(float));
  }
  transfers_.clear();
  dev_.synchronize();  // the host copy may change once we return
}

void Engine::Impl::invalidate_gathers() {
  for (Slot* s : gather_slots()) {
    if (s->work.valid()) s->work.wait();
    s->block = -1;
    s->converted = -1;
  }
}

}  // namespace dtrain::sharding
