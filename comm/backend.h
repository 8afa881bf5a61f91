// comm::Backend: what a library (gloo/, mpi/, nccl/) provides to a
// Communicator. A backend runs one operation at a time, synchronously, on
// the communicator's comm thread only; it needs no locking of its own.
//
// A backend must
// - return within op.deadline, throwing TimeoutError when its peers do not
//   show up, and CommError when a peer dies or the library fails (keeping the
//   library's own error text);
// - not allocate large buffers per operation (fresh memory costs ~15 us per
//   page here): scratch space is kept and reused;
// - handle count == 0 by returning at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "comm/store.h"
#include "core/dtype.h"
#include "core/fence.h"

namespace dtrain::comm {

enum class ReduceOp : std::uint8_t { sum, avg, max };
enum class OpKind : std::uint8_t { allreduce, reduce_scatter, allgather, broadcast, barrier };

const char* reduce_op_name(ReduceOp op);
const char* op_kind_name(OpKind kind);

// One queued collective. For allreduce and broadcast, input == output.
struct Op {
  OpKind kind = OpKind::barrier;
  std::uint64_t seq = 0;               // 1, 2, ... per communicator
  const void* input = nullptr;
  void* output = nullptr;
  std::size_t count = 0;               // elements; per rank for reduce_scatter/allgather
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  std::chrono::steady_clock::time_point deadline{};
  // What must happen before the collective touches its buffers: the end of
  // the kernels that produce `input` (and of those still reading `output`),
  // from the device that owns them (core/fence.h). Null: nothing. The comm
  // thread waits for it on the host, except that a backend that runs on a
  // device waits for a CUDA fence on its own stream instead.
  FencePtr ready = nullptr;
  // Set by the comm thread; a backend that runs on a device calls it once the
  // collective is queued there, with a fence that completes with it.
  std::function<void(FencePtr done)> launched = nullptr;

  // "allreduce #12 (f32 x 1048576, sum)"
  std::string describe() const;
  std::size_t bytes() const;  // bytes of one rank's input
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "gloo", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Runs op to completion, or throws. Called only from the comm thread.
  virtual void run(const Op& op) = 0;
  // Whether run() itself honours op.deadline. When false (MPI), the
  // communicator's watchdog fails the operation at its deadline instead.
  virtual bool enforces_deadline() const { return true; }
  // Whether collectives run on a device's stream (nccl): run() then waits
  // for a CUDA ready fence on that stream and calls op.launched once queued.
  virtual bool runs_on_device() const { return false; }
};

}  // namespace dtrain::comm
