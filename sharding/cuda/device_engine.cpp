#include "sharding/cuda/device_engine.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/cuda/adamw.h"
#include "nn/cuda/check.h"
#include "nn/cuda/clip.h"
#include "nn/cuda/convert.h"
#include "nn/cuda/device_buffer.h"

namespace dtrain::sharding::cuda {
namespace {

using nn::cuda::DeviceBuffer;

constexpr std::size_t as_size(std::int64_t n) { return static_cast<std::size_t>(n); }

}  // namespace

// Device memory of the engine: f32 masters, gradients and moments (all
// blocks back to back), 16-bit compute copies and reduction staging of the
// same shape when the precision asks for them, and the norm's scratch.
struct DeviceEngine::Buffers {
  DeviceBuffer<float> params, grads, exp_avg, exp_avg_sq;
  DeviceBuffer<std::uint16_t> compute, staging;
  DeviceBuffer<double> sum_sq{1};
  DeviceBuffer<float> clip{2};  // [0]: clipping factor, [1]: norm of the scaled gradients
  float* host_norm = nullptr;   // pinned: where the norm is read back

  Buffers(std::int64_t total, bool half_compute, bool half_reduce)
      : params(as_size(total)), grads(as_size(total)), exp_avg(as_size(total)),
        exp_avg_sq(as_size(total)), compute(half_compute ? as_size(total) : 0),
        staging(half_reduce ? as_size(total) : 0) {
    DTRAIN_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host_norm), sizeof(float), cudaHostAllocDefault));
  }
  ~Buffers() {
    if (host_norm != nullptr) cudaFreeHost(host_norm);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

DeviceEngine::DeviceEngine(const nn::ParameterLayout& layout, Engine& host, comm::Communicator* comm,
                           int world_size, DeviceEngineOptions options, cudaStream_t stream)
    : layout_(layout), comm_(comm), options_(options), stream_(stream), scaler_(host.loss_scaler()) {
  if (host.stage() != 0) {
    throw ConfigError("parallel.zero_stage",
                      fmt::format("device cuda supports stage 0 only in this version, not {}; use "
                                  "zero_stage 0 or device cpu", host.stage()));
  }
  DTRAIN_CHECK(comm == nullptr || comm->world_size() == world_size, "device communicator of {} ranks, job of {}",
               comm == nullptr ? 0 : comm->world_size(), world_size);
  std::vector<std::int64_t> padded;
  for (int b = 0; b < layout.num_blocks(); ++b) {
    const std::int64_t n = layout.blocks()[as_size(b)].numel;
    offsets_.push_back(layout.block_offset(b));
    numel_.push_back(n);
    padded.push_back(padded_size(n, world_size));
  }
  plan_ = plan_buckets(padded, options.bucket_mb);
  bucket_ready_.assign(plan_.buckets.size(), nullptr);
  for (cudaEvent_t& e : bucket_ready_) DTRAIN_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  buffers_ = std::make_unique<Buffers>(layout.total_numel(), half_compute(), half_reduce());
  buffers_->grads.zero(stream_);
  upload_state(host);
}

DeviceEngine::~DeviceEngine() {
  // Collectives still in flight read our buffers and events: let them finish.
  for (Pending& p : pending_) {
    try {
      p.work.wait();
    } catch (const std::exception&) {  // reported where it was waited for
    }
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : bucket_ready_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

std::int64_t DeviceEngine::device_bytes() const {
  const Buffers& b = *buffers_;
  return static_cast<std::int64_t>(b.params.bytes() + b.grads.bytes() + b.exp_avg.bytes() +
                                   b.exp_avg_sq.bytes() + b.compute.bytes() + b.staging.bytes());
}

nn::BlockPointers DeviceEngine::pointers() const {
  nn::BlockPointers p;
  Buffers& b = *buffers_;
  for (std::size_t i = 0; i < offsets_.size(); ++i) {
    p.params.push_back(b.params.data() + offsets_[i]);
    p.grads.push_back(b.grads.data() + offsets_[i]);
    if (half_compute()) p.compute.push_back(b.compute.data() + offsets_[i]);
  }
  return p;
}

float* DeviceEngine::tensor(StateTensor t) {
  switch (t) {
    case StateTensor::params: return buffers_->params.data();
    case StateTensor::exp_avg: return buffers_->exp_avg.data();
    case StateTensor::exp_avg_sq: return buffers_->exp_avg_sq.data();
  }
  return nullptr;
}

void DeviceEngine::begin_step() {
  buffers_->grads.zero(stream_);
  pending_.clear();
  sync_ = true;
  norm_taken_ = false;
}

void DeviceEngine::after_backward(int block) {
  if (sync_) reduce_bucket_ending_at(block);
}

// The bucket's gradients are final once the kernels queued so far have run:
// an event marks that point on the compute stream and the all-reduce waits
// for it on the GPU.
void DeviceEngine::reduce_bucket_ending_at(int block) {
  const int index = plan_.bucket_of[as_size(block)];
  const Bucket& bucket = plan_.buckets[as_size(index)];
  if (bucket.lo != block) return;  // more blocks of this bucket still to come
  const std::int64_t begin = offsets_[as_size(bucket.lo)];
  const std::int64_t end = offsets_[as_size(bucket.hi)] + numel_[as_size(bucket.hi)];
  float* grads = buffers_->grads.data() + begin;
  void* data = grads;
  if (half_reduce()) {  // 16 bits on the wire; finish_backward() widens the result
    std::uint16_t* staged = buffers_->staging.data() + begin;
    nn::cuda::f32_to_half(grads, options_.reduce, staged, end - begin, stream_);
    data = staged;
  }
  if (comm_ == nullptr) {  // one rank: the average is the gradient itself, as it travels
    if (half_reduce()) {
      nn::cuda::half_to_f32(static_cast<const std::uint16_t*>(data), options_.reduce, grads, end - begin,
                            stream_);
    }
    return;
  }
  cudaEvent_t ready = bucket_ready_[as_size(index)];
  DTRAIN_CUDA_TRY(cudaEventRecord(ready, stream_));
  comm::Work work = comm_->allreduce(data, as_size(end - begin), options_.reduce, comm::ReduceOp::avg, ready);
  pending_.push_back(Pending{std::move(work), begin, end - begin});
}

void DeviceEngine::finish_backward() {
  for (Pending& p : pending_) {
    p.work.wait();
    if (half_reduce()) {
      nn::cuda::half_to_f32(buffers_->staging.data() + p.offset, options_.reduce,
                            buffers_->grads.data() + p.offset, p.size, stream_);
    }
  }
  pending_.clear();
}

double DeviceEngine::grad_norm(float max_norm) {
  Buffers& b = *buffers_;
  DTRAIN_CUDA_TRY(cudaMemsetAsync(b.sum_sq.data(), 0, sizeof(double), stream_));
  for (std::size_t i = 0; i < offsets_.size(); ++i) {  // per block, as the host engine sums
    nn::cuda::sum_of_squares(b.grads.data() + offsets_[i], numel_[i], b.sum_sq.data(), stream_);
  }
  // The gradients hold loss_scale x the true ones: the factor compares their
  // norm with max_norm x scale, and AdamW unscales (step()).
  const double scale = scaler_.scale();
  const float scaled_max = max_norm > 0.0f ? static_cast<float>(max_norm * scale) : max_norm;
  nn::cuda::clip_factor(b.sum_sq.data(), scaled_max, b.clip.data(), b.clip.data() + 1, stream_);
  DTRAIN_CUDA_TRY(cudaMemcpyAsync(b.host_norm, b.clip.data() + 1, sizeof(float), cudaMemcpyDeviceToHost, stream_));
  DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream_));
  last_norm_ = static_cast<double>(*b.host_norm) / scale;
  norm_taken_ = true;
  return last_norm_;
}

bool DeviceEngine::step(const nn::AdamWHyper& hyper, std::int64_t step) {
  DTRAIN_CHECK(norm_taken_, "DeviceEngine::step needs grad_norm() first (it computes the clipping factor)");
  const double scale = scaler_.scale();
  if (scaler_.enabled() && !scaler_.update(!std::isfinite(last_norm_))) return false;
  Buffers& b = *buffers_;
  // The clipping factor stays on the device; the loss scale (a power of two,
  // so unscaling is exact) goes in as grad_scale, which adamw_step fixes at 1.
  if (scale != 1.0) {
    for (const nn::ParamSpec& p : layout_.params()) {
      const std::int64_t off = layout_.block_offset(p.block) + p.offset;
      nn::cuda::adamw_update(b.params.data() + off, b.grads.data() + off, b.exp_avg.data() + off,
                             b.exp_avg_sq.data() + off, p.numel, hyper, p.decay ? hyper.weight_decay : 0.0f,
                             step, static_cast<float>(1.0 / scale), b.clip.data(), stream_);
    }
  } else {
    nn::cuda::adamw_step(layout_, b.params.data(), b.grads.data(), b.exp_avg.data(), b.exp_avg_sq.data(),
                         hyper, step, b.clip.data(), stream_);
  }
  refresh_compute();
  return true;
}

void DeviceEngine::refresh_compute() {
  if (!half_compute()) return;
  nn::cuda::f32_to_half(buffers_->params.data(), options_.compute, buffers_->compute.data(),
                        layout_.total_numel(), stream_);
}

void DeviceEngine::download_state(Engine& host) {
  for (const StateSlice& s : host.owned_state()) {
    if (s.range.size == 0) continue;
    const DeviceSpan at = locate(offsets_, numel_, s.tensor, s.block, s.range);
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(s.data, tensor(at.tensor) + at.offset, as_size(at.size) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  }
  DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream_));
}

void DeviceEngine::upload_state(Engine& host) {
  for (const StateSlice& s : host.state_to_load()) {
    if (s.range.size == 0) continue;
    const DeviceSpan at = locate(offsets_, numel_, s.tensor, s.block, s.range);
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(tensor(at.tensor) + at.offset, s.data, as_size(at.size) * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
  }
  refresh_compute();
  // The host buffers are pageable and may change once we return.
  DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream_));
}

}  // namespace dtrain::sharding::cuda
