#include "sharding/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "sharding/engine_state.h"

namespace dtrain::sharding {

using Clock = std::chrono::steady_clock;

Engine::Engine(const nn::ParameterLayout& layout, comm::Communicator& comm, nn::Device& device,
               EngineOptions options)
    : layout_(layout), comm_(comm), options_(options), scaler_(options.loss_scaling) {
  if (options.stage < 0 || options.stage > 3) {
    throw ConfigError("parallel.zero_stage", fmt::format("{} is not a ZeRO stage (0, 1, 2 or 3)", options.stage));
  }
  auto float_type = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  if (!float_type(options.compute)) {
    throw ConfigError("precision", fmt::format("{} is not a compute type", dtype_name(options.compute)));
  }
  if (!float_type(options.reduce)) {
    throw ConfigError("parallel.reduce_dtype", fmt::format("{} is not a float type", dtype_name(options.reduce)));
  }
  impl_ = std::make_unique<Impl>(layout, comm, device, options);
  memory_ = impl_->memory();
  impl_->initialise_parameters(options.seed);
}

Engine::~Engine() {
  // Collectives and kernels still in flight use our buffers: let them finish.
  impl_->wait_all();
}

nn::BlockPointers Engine::pointers() const { return impl_->pointers(); }

void Engine::begin_step() {
  impl_->zero_gradients();
  comm_stats_ = CommStats{};
  sync_ = true;
  norm_taken_ = false;
}

void Engine::before_forward(int block) {
  if (options_.stage == 3) impl_->gather_for(block, +1);
  if (block == 0) impl_->start_micro_batch();
}

void Engine::after_forward(int /*block*/) {}

void Engine::before_backward(int block) {
  if (options_.stage == 3) impl_->gather_for(block, -1);
  if (options_.stage >= 2) impl_->prepare_gradient_slot(block);
}

void Engine::after_backward(int block) {
  if (gradient_hook_) {
    DTRAIN_CHECK(impl_->device().host_memory(), "a gradient hook on {}, whose memory the host cannot reach",
                 impl_->device().name());
    impl_->device().synchronize();
    gradient_hook_(block, impl_->local_gradients(block), layout_.blocks()[static_cast<std::size_t>(block)].numel);
  }
  if (block == 0 && sync_ && !comm_stats_.overlapped) comm_stats_.overlapped = impl_->first_collective_started();
  if (options_.stage >= 2) {
    impl_->reduce_scatter_block(block);
  } else if (sync_) {
    impl_->reduce_bucket_ending_at(block);
  }
}

void Engine::finish_backward() {
  const auto t0 = Clock::now();
  impl_->wait_gradients();
  comm_stats_.exposed_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  comm_stats_.comm_seconds = impl_->take_gradient_comm_seconds();
}

double Engine::grad_norm() {
  last_norm_ = std::sqrt(impl_->grad_sum_of_squares()) / scaler_.scale();
  norm_taken_ = true;
  return last_norm_;
}

bool Engine::step(const nn::AdamWHyper& hyper, std::int64_t step, float grad_scale) {
  const double scale = scaler_.scale();
  if (scaler_.enabled()) {
    DTRAIN_CHECK(norm_taken_, "Engine::step with loss scaling needs grad_norm() first");
    if (!scaler_.update(!std::isfinite(last_norm_))) return false;
  }
  impl_->optimizer_step(hyper, step, static_cast<float>(grad_scale / scale));
  return true;
}

std::vector<float> Engine::gather_parameters() { return impl_->gather_parameters(); }

std::vector<StateSlice> Engine::owned_state() { return impl_->state_slices(/*owned_only=*/true); }

std::vector<StateSlice> Engine::state_to_load() { return impl_->state_slices(/*owned_only=*/false); }

void Engine::state_loaded() {
  impl_->upload_loaded_state();
  impl_->invalidate_gathers();
  impl_->refresh_compute();
}

nn::Device& Engine::device() { return impl_->device(); }

MemoryStats Engine::plan_memory(const nn::ParameterLayout& layout, int world, const EngineOptions& options) {
  return plan_buffers(layout, world, options).stats();
}

}  // namespace dtrain::sharding
