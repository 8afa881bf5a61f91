// nn::cuda::CudaDevice: a CUDA GPU as an nn::Device (nn/device.h). Memory is
// the GPU's (cudaMalloc, zero-filled) and pinned host memory; every copy,
// fill and kernel (the engine's below, the model's through CudaKernels,
// nn/cuda/cuda_kernels.h) is queued in order on one non-blocking compute
// stream, with a cuBLAS handle for its products. fence() records a pooled
// CUDA event there (core/cuda/event_fence.h); wait() makes the stream wait
// for another stream's event on the GPU, or the host for a host fence.
// synchronize() polls the stream until timeout(): no wait is unbounded.
// Errors name the device ("cuda:0") and keep CUDA's and cuBLAS's own text.
//
// Threading: one thread submits work. The Device calls make the GPU current
// on the calling thread first (the kernel set's launches rely on that: they
// run on the submitting thread after it). Fences may be waited on and
// dropped from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>

#include "core/cuda/event_fence.h"
#include "nn/cuda/matmul.h"
#include "nn/device.h"

namespace dtrain::nn::cuda {

class CudaDevice final : public Device {
 public:
  // GPU `index` of the visible ones. Throws ConfigError naming `device` when
  // there is no such GPU, Error when it cannot be used.
  CudaDevice(int index, std::chrono::milliseconds timeout);
  // Waits (bounded) for queued work, which may still use memory of others.
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override;  // "cuda:0"
  bool host_memory() const override { return false; }
  bool asynchronous() const override { return true; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  // The queue: copies and fills, fences and waits (see the top of this file).
  FencePtr fence() override;
  void wait(const FencePtr& fence) override;
  void synchronize() override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void zero(void* dst, std::size_t bytes) override;

  void* allocate(std::size_t bytes) override;       // cudaMalloc, zero-filled on the stream
  void release(void* p) noexcept override;           // cudaFree
  void* allocate_host(std::size_t bytes) override;  // pinned (cudaHostAlloc), touched
  void release_host(void* p) noexcept override;

  // The engine's kernels (nn/cuda/adamw.h, convert.h, residual.h).
  void adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
             const AdamWHyper& hyper, float weight_decay, std::int64_t step, float grad_scale) override;
  void sum_of_squares(const float* x, std::int64_t n, double* total) override;
  void add(float* dst, const float* src, std::int64_t n) override;
  void to_f32(const std::uint16_t* src, DType half, float* dst, std::int64_t n, bool accumulate) override;
  void to_half(const float* src, std::uint16_t* dst, DType half, std::int64_t n) override;

  // The Graph over CudaKernels<F> for config.compute (cuda_model.cpp).
  std::unique_ptr<Model> make_model(const ModelConfig& config, const ParameterLayout& layout, std::int64_t batch,
                                    std::int64_t seq_len) override;

  // What the kernel set queues on (submitting thread only).
  cudaStream_t stream() const { return stream_; }
  Blas& blas() { return *blas_; }
  int index() const { return index_; }

 private:
  void make_current() const;

  int index_;  // first: its initialisation makes the GPU current for the rest
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  dtrain::cuda::EventPool events_;
};

}  // namespace dtrain::nn::cuda
