#include "nn/cuda/cuda_device.h"

#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "core/cuda/check.h"
#include "core/error.h"
#include "core/plugin.h"
#include "nn/cuda/adamw.h"
#include "nn/cuda/convert.h"
#include "nn/cuda/residual.h"
#include "nn/cuda_device.h"

namespace dtrain::nn::cuda {
namespace {

// `index` once it names a visible GPU, made current on this thread.
int select_gpu(int index) {
  std::string why;
  const int count = dtrain::cuda::device_count(&why);
  if (count == 0) throw ConfigError("device", fmt::format("cuda needs a GPU: {}", why));
  if (index < 0 || index >= count) {
    throw ConfigError("device", fmt::format("cuda:{} does not exist: {} device(s) are visible (0-{}); check "
                                            "CUDA_VISIBLE_DEVICES and the ranks per node",
                                            index, count, count - 1));
  }
  DTRAIN_CUDA_CHECK(cudaSetDevice(index));
  return index;
}

// fn(std::integral_constant<DType, half>) for a 16-bit `half`.
template <class Fn>
void with_half(DType half, Fn&& fn) {
  if (half == DType::bf16) return fn(std::integral_constant<DType, DType::bf16>{});
  DTRAIN_CHECK(half == DType::f16, "{} is not a 16-bit float type", dtype_name(half));
  fn(std::integral_constant<DType, DType::f16>{});
}

}  // namespace

CudaDevice::CudaDevice(int index, std::chrono::milliseconds timeout)
    : index_(select_gpu(index)), timeout_(timeout), events_(index_) {
  DTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  blas_ = std::make_unique<Blas>();
}

CudaDevice::~CudaDevice() {
  try {
    synchronize();
  } catch (const std::exception&) {  // reported where the work was waited for
  }
  blas_.reset();  // before the stream it was last bound to
  cudaStreamDestroy(stream_);
}

std::string CudaDevice::name() const { return dtrain::cuda::device_name(index_); }

void CudaDevice::make_current() const { DTRAIN_CUDA_CHECK(cudaSetDevice(index_)); }

void* CudaDevice::allocate(std::size_t bytes) {
  make_current();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (dtrain::cuda::failed(e)) {
    dtrain::cuda::throw_failure(e, fmt::format("cudaMalloc of {} bytes", bytes).c_str(), __FILE__, __LINE__, index_);
  }
  const cudaError_t zeroed = cudaMemsetAsync(p, 0, bytes, stream_);  // before any use: all of it is queued here
  if (dtrain::cuda::failed(zeroed)) {
    cudaFree(p);
    dtrain::cuda::throw_failure(zeroed, "cudaMemsetAsync(p, 0, bytes, stream)", __FILE__, __LINE__, index_);
  }
  return p;
}

void CudaDevice::release(void* p) noexcept {
  cudaSetDevice(index_);
  cudaFree(p);  // waits for the work still using it; no throw from a release
}

void* CudaDevice::allocate_host(std::size_t bytes) {
  make_current();
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (dtrain::cuda::failed(e)) {
    dtrain::cuda::throw_failure(e, fmt::format("cudaHostAlloc of {} bytes", bytes).c_str(), __FILE__, __LINE__,
                                index_);
  }
  std::memset(p, 0, bytes);  // touched now, not in the first step
  return p;
}

void CudaDevice::release_host(void* p) noexcept {
  cudaSetDevice(index_);
  cudaFreeHost(p);
}

void CudaDevice::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  make_current();
  DTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void CudaDevice::zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  make_current();
  DTRAIN_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

FencePtr CudaDevice::fence() {
  make_current();
  return events_.record(stream_);
}

void CudaDevice::wait(const FencePtr& fence) {
  if (fence == nullptr) return;
  if (const void* event = fence->cuda_event()) {  // ordered on the GPU; the host goes on
    make_current();
    DTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(const_cast<void*>(event)), 0));
    return;
  }
  const auto limit = fence_wait_limit(timeout_);
  if (!fence->wait_until(Fence::Clock::now() + limit)) {
    throw TimeoutError(fmt::format("{}: a wait for other work (a collective) did not end within {} ms", name(),
                                   limit.count()));
  }
}

void CudaDevice::synchronize() {
  make_current();
  const auto deadline = Fence::Clock::now() + timeout_;
  if (!dtrain::cuda::poll_until([s = stream_] { return cudaStreamQuery(s); }, "cudaStreamQuery", index_, deadline)) {
    throw TimeoutError(fmt::format("{}: queued work did not finish within {} ms (parallel.timeout_s)", name(),
                                   timeout_.count()));
  }
}

void CudaDevice::to_half(const float* src, std::uint16_t* dst, DType half, std::int64_t n) {
  with_half(half, [&](auto d) { to_format<decltype(d)::value>(src, dst, n, stream_); });
}

void CudaDevice::to_f32(const std::uint16_t* src, DType half, float* dst, std::int64_t n, bool accumulate) {
  with_half(half, [&](auto d) { widen<decltype(d)::value>(src, dst, n, accumulate, stream_); });
}

void CudaDevice::add(float* dst, const float* src, std::int64_t n) { residual(dst, src, dst, n, stream_); }

void CudaDevice::sum_of_squares(const float* x, std::int64_t n, double* total) {
  cuda::sum_of_squares(x, n, total, stream_);
}

void CudaDevice::adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                       const AdamWHyper& hyper, float weight_decay, std::int64_t step, float grad_scale) {
  adamw_update(param, grad, exp_avg, exp_avg_sq, n, adamw_constants(hyper, weight_decay, step, grad_scale),
               stream_);
}

}  // namespace dtrain::nn::cuda

// The CUDA plugin's entry point for nn::make_cuda_device (nn/cuda_device.h).
extern "C" DTRAIN_PLUGIN_EXPORT dtrain::nn::Device* dtrain_make_cuda_device(int index, long long timeout_ms) {
  return new dtrain::nn::cuda::CudaDevice(index, std::chrono::milliseconds(timeout_ms));
}
static_assert(std::is_same_v<decltype(dtrain_make_cuda_device), dtrain::nn::MakeCudaDeviceFn>);
