#include "comm/nccl/backend.h"

#include <cstring>
#include <string>
#include <thread>
#include <type_traits>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include "core/cuda/check.h"
#include "core/cuda/event_fence.h"
#include "core/error.h"
#include "core/plugin.h"

namespace dtrain::comm::nccl_backend {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    default: return ncclUint8;
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

class NcclBackend : public Backend {
 public:
  NcclBackend(int rank, int world_size, const ShareUniqueId& share, int device, Duration timeout)
      : rank_(rank), world_size_(world_size), device_(device), events_(device) {
    DTRAIN_CUDA_CHECK(cudaSetDevice(device));
    DTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DTRAIN_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank == 0) DTRAIN_CUDA_CHECK(ncclGetUniqueId(&id));
    share(&id, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DTRAIN_CUDA_CHECK(ncclCommInitRankConfig(&comm_, world_size, id, rank, &config));
    await(Clock::now() + timeout, "ncclCommInitRankConfig", Until::done);
  }

  ~NcclBackend() override {
    if (comm_ != nullptr) (aborted_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }
  bool runs_on_device() const override { return true; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  void run(const Op& op) override {
    DTRAIN_CUDA_CHECK(cudaSetDevice(device_));
    const void* ready = op.ready != nullptr ? op.ready->cuda_event() : nullptr;
    if (ready != nullptr) {  // ordered after the producer's kernels on the GPU, not on the host
      DTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(const_cast<void*>(ready)), 0));
    }
    const ncclDataType_t type = nccl_type(op.dtype);
    switch (op.kind) {
      case OpKind::allreduce:
        DTRAIN_CUDA_CHECK(ncclAllReduce(op.input, op.output, op.count, type, nccl_op(op.reduce), comm_, stream_));
        break;
      case OpKind::reduce_scatter:
        DTRAIN_CUDA_CHECK(ncclReduceScatter(op.input, op.output, op.count, type, nccl_op(op.reduce), comm_, stream_));
        break;
      case OpKind::allgather:
        DTRAIN_CUDA_CHECK(ncclAllGather(op.input, op.output, op.count, type, comm_, stream_));
        break;
      case OpKind::broadcast:
        DTRAIN_CUDA_CHECK(ncclBroadcast(op.input, op.output, op.count, type, op.root, comm_, stream_));
        break;
      case OpKind::barrier:  // NCCL has none: a one-element allreduce orders the ranks
        DTRAIN_CUDA_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
        break;
    }
    const std::string what = op.describe();
    // Once NCCL has queued it (a non-blocking communicator may still be doing
    // so after the call returns), later work on the device can wait for it on
    // the GPU: the done fence completes with it.
    await(op.deadline, what.c_str(), Until::queued);
    if (op.launched) op.launched(events_.record(stream_));
    await(op.deadline, what.c_str(), Until::done);
  }

 private:
  enum class Until { queued, done };

  // Polls the communicator until its operation is queued (no longer
  // ncclInProgress) and, for Until::done, NCCL's stream until it ran; aborts
  // the communicator past the deadline (no host wait inside NCCL can hang us).
  void await(Clock::time_point deadline, const char* what, Until until) {
    for (;;) {
      ncclResult_t async = ncclSuccess;
      DTRAIN_CUDA_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        aborted_ = true;
        throw CommError(fmt::format("nccl on {}: {} failed: {}", dtrain::cuda::device_name(device_), what,
                                    ncclGetErrorString(async)));
      }
      if (async == ncclSuccess) {
        if (until == Until::queued) return;
        const cudaError_t e = cudaStreamQuery(stream_);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) dtrain::cuda::throw_failure(e, "cudaStreamQuery(nccl stream)", __FILE__, __LINE__);
      }
      if (Clock::now() > deadline) {
        aborted_ = true;
        throw TimeoutError(fmt::format("nccl on {}: {} did not complete; communicator aborted",
                                       dtrain::cuda::device_name(device_), what));
      }
      std::this_thread::yield();
    }
  }

  int rank_;
  int world_size_;
  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  float* scratch_ = nullptr;
  bool aborted_ = false;
  dtrain::cuda::EventPool events_;  // done fences
};

}  // namespace

std::unique_ptr<Backend> make_backend(int rank, int world_size, ShareUniqueId share, int device,
                                      Duration timeout) {
  std::string why;
  const int count = dtrain::cuda::device_count(&why);
  if (count == 0) {
    throw CommError(fmt::format("backend nccl needs a CUDA device: {}", why));
  }
  if (device < 0 || device >= count) {
    throw CommError(fmt::format("backend nccl: rank {} was given CUDA device {}, but {} device(s) are visible "
                                "(0-{}); check CUDA_VISIBLE_DEVICES and the ranks per node",
                                rank, device, count, count - 1));
  }
  return std::make_unique<NcclBackend>(rank, world_size, share, device, timeout);
}

}  // namespace dtrain::comm::nccl_backend

// The CUDA plugin's entry point for nccl_backend::load_backend (comm/nccl/backend.h).
extern "C" DTRAIN_PLUGIN_EXPORT dtrain::comm::Backend* dtrain_make_nccl_backend(
    int rank, int world_size, const dtrain::comm::nccl_backend::ShareUniqueId* share, int device,
    long long timeout_ms) {
  return dtrain::comm::nccl_backend::make_backend(rank, world_size, *share, device,
                                                  std::chrono::milliseconds(timeout_ms))
      .release();
}
static_assert(std::is_same_v<decltype(dtrain_make_nccl_backend), dtrain::comm::nccl_backend::MakeBackendFn>);
