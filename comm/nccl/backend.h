// The NCCL backend: GPU collectives on one CUDA stream of its own. The
// unique id travels through the run's store or over MPI (comm/connect.cpp). NCCL runs non-blocking
// (config.blocking = 0): every call is polled against the operation's
// deadline, and a communicator past it is aborted (ncclCommAbort), so a
// missing peer gives a TimeoutError rather than a hang.
// Compiled only when CUDA is enabled (DTRAIN_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "comm/backend.h"

namespace dtrain::comm::nccl_backend {

// Number of CUDA devices this process can use; 0 with a reason in `why` when
// there is no driver or device.
int cuda_device_count(std::string* why);

// Hands NCCL's unique id (`bytes` at `id`) from rank 0, which filled it in,
// to every other rank (through the store, or over MPI).
using ShareUniqueId = std::function<void(void* id, std::size_t bytes)>;

std::unique_ptr<Backend> make_backend(int rank, int world_size, ShareUniqueId share, int device,
                                      Duration timeout);

}  // namespace dtrain::comm::nccl_backend
