// The NCCL backend: GPU collectives on one CUDA stream of its own. The
// unique id travels through the run's store or over MPI (comm/connect.cpp).
// NCCL runs non-blocking (config.blocking = 0): every call is polled against
// the operation's deadline, and a communicator past it is aborted
// (ncclCommAbort), so a missing peer gives a TimeoutError rather than a hang.
// A collective waits for its ready fence's CUDA event on the GPU and reports
// a done fence once queued (Op::launched), so compute streams never wait on
// the host.
//
// It lives in the CUDA plugin (core/plugin.h), built only when CUDA is
// enabled; the rest of dtrain reaches it through load_backend().
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "comm/backend.h"

namespace dtrain::comm::nccl_backend {

// Hands NCCL's unique id (`bytes` at `id`) from rank 0, which filled it in,
// to every other rank (through the store, or over MPI).
using ShareUniqueId = std::function<void(void* id, std::size_t bytes)>;

// The backend of `rank` on CUDA device `device` (in the plugin).
std::unique_ptr<Backend> make_backend(int rank, int world_size, ShareUniqueId share, int device, Duration timeout);

// make_backend through the plugin; ConfigError naming parallel.backend when
// the plugin cannot be loaded.
std::unique_ptr<Backend> load_backend(int rank, int world_size, ShareUniqueId share, int device, Duration timeout);

// What the plugin exports (C linkage, found by name); the caller owns the result.
extern "C" {
using MakeBackendFn = Backend*(int rank, int world_size, const ShareUniqueId* share, int device, long long timeout_ms);
}
inline constexpr const char* kMakeBackendSymbol = "dtrain_make_nccl_backend";

}  // namespace dtrain::comm::nccl_backend
