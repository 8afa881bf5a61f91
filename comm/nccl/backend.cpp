#include "comm/nccl/backend.h"

#include <cstring>
#include <thread>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include "core/error.h"

// Wrap CUDA and NCCL calls: failures throw CommError with the call, file:line
// and the library's own error string.
#define DTRAIN_CUDA_CHECK(call)                                                              \
  do {                                                                                       \
    const cudaError_t _e = (call);                                                           \
    if (_e != cudaSuccess)                                                                   \
      throw ::dtrain::CommError(fmt::format("cuda: {} failed at {}:{}: {}", #call, __FILE__, \
                                            __LINE__, cudaGetErrorString(_e)));              \
  } while (0)

#define DTRAIN_NCCL_CHECK(call)                                                               \
  do {                                                                                        \
    const ncclResult_t _r = (call);                                                           \
    if (_r != ncclSuccess && _r != ncclInProgress)                                            \
      throw ::dtrain::CommError(fmt::format("nccl: {} failed at {}:{}: {}", #call, __FILE__,  \
                                            __LINE__, ncclGetErrorString(_r)));               \
  } while (0)

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
      : rank_(rank), world_size_(world_size), device_(device) {
    DTRAIN_CUDA_CHECK(cudaSetDevice(device));
    DTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DTRAIN_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank == 0) DTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
    share(&id, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DTRAIN_NCCL_CHECK(ncclCommInitRankConfig(&comm_, world_size, id, rank, &config));
    await(Clock::now() + timeout, "ncclCommInitRankConfig");
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
        DTRAIN_NCCL_CHECK(ncclAllReduce(op.input, op.output, op.count, type, nccl_op(op.reduce), comm_, stream_));
        break;
      case OpKind::reduce_scatter:
        DTRAIN_NCCL_CHECK(ncclReduceScatter(op.input, op.output, op.count, type, nccl_op(op.reduce), comm_, stream_));
        break;
      case OpKind::allgather:
        DTRAIN_NCCL_CHECK(ncclAllGather(op.input, op.output, op.count, type, comm_, stream_));
        break;
      case OpKind::broadcast:
        DTRAIN_NCCL_CHECK(ncclBroadcast(op.input, op.output, op.count, type, op.root, comm_, stream_));
        break;
      case OpKind::barrier:  // NCCL has none: a one-element allreduce orders the ranks
        DTRAIN_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
        break;
    }
    await(op.deadline, op.describe().c_str());
  }

 private:
  // Polls the communicator and the stream until the work is done; aborts the
  // communicator past the deadline (no host sync inside NCCL can hang us).
  void await(Clock::time_point deadline, const char* what) {
    for (;;) {
      ncclResult_t async = ncclSuccess;
      DTRAIN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        aborted_ = true;
        throw CommError(fmt::format("nccl: {} failed: {}", what, ncclGetErrorString(async)));
      }
      if (async == ncclSuccess) {
        const cudaError_t e = cudaStreamQuery(stream_);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) DTRAIN_CUDA_CHECK(e);
      }
      if (Clock::now() > deadline) {
        aborted_ = true;
        throw TimeoutError(fmt::format("nccl: {} did not complete; communicator aborted", what));
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
};

}  // namespace

int cuda_device_count(std::string* why) {
  int count = 0;  // left unwritten when there is no driver
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    if (why != nullptr) *why = fmt::format("no usable CUDA device: {}", cudaGetErrorString(e));
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device found";
  return count;
}

std::unique_ptr<Backend> make_backend(int rank, int world_size, ShareUniqueId share, int device,
                                      Duration timeout) {
  std::string why;
  const int count = cuda_device_count(&why);
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
