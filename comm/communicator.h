// comm::Communicator: collectives over one group of ranks (docs/ARCHITECTURE.md, "Core
// abstractions"). Every call is asynchronous: it queues the operation for the
// communicator's comm thread and returns a Work. The comm thread runs
// operations one at a time in submission order, so all ranks issue the same
// sequence and compute overlaps communication.
//
// Contract:
// - Each operation gets a sequence number (1, 2, ...) in submission order;
//   errors and logs name it, with the operation, dtype, count and the ranks.
// - The caller keeps every buffer alive and untouched until the Work
//   completes. Buffers live where the backend's device is (host for gloo and
//   mpi, the communicator's CUDA device for nccl).
// - Counts are elements, not bytes. reduce_scatter and allgather take the
//   count of one rank's slice: reduce_scatter reads world_size*count elements
//   and writes count; allgather reads count and writes world_size*count. In
//   place is allowed: allreduce always; allgather when input is output's
//   slice `rank`; reduce_scatter when output is input's slice `rank`.
// - bf16 and f16 reductions accumulate in f32 on CPU backends.
// - Once an operation fails (timeout, dead peer), the communicator is broken:
//   every later operation fails at once with the first error. A broken
//   communicator cannot be repaired; the process should exit (the launcher
//   restarts the job).
// - Calls may come from any thread; submission order is the order calls
//   return in.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "comm/backend.h"
#include "comm/store.h"
#include "core/dtype.h"

namespace dtrain::comm {

struct WorkState;
class CommThread;
class OpStats;
class OpObserver;

// A handle on one queued operation. Cheap to copy; all copies share state.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // Blocks until the operation completed and rethrows its error (CommError,
  // TimeoutError). Without a timeout it waits for the communicator's timeout
  // plus the time its diagnosis of a failure may take.
  void wait();
  // As wait(), but throws TimeoutError naming the operation once `timeout`
  // passes while it is still queued or running (the operation itself goes on).
  void wait(Duration timeout);
  bool completed() const;
  // Whether the comm thread has begun running it (or it completed).
  bool started() const;
  std::uint64_t seq() const;
  // Seconds the comm thread spent on it (0 until it completed).
  double run_seconds() const;
  // A fence that is reached when the operation completes, for a device queue
  // to wait on before it reads the output (core/fence.h). On a backend that
  // runs on a device (nccl) this waits until the collective is queued there
  // (not until it completes) and returns its CUDA fence; on host backends it
  // returns at once a fence that waits for completion and rethrows the error.
  FencePtr done_fence() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<WorkState> state_;
};

struct CommunicatorOptions {
  std::string name = "world";         // names the group in errors and store keys
  Duration timeout = std::chrono::seconds(300);  // per operation (parallel.timeout_s)
  // Where ranks report which operation they reached when one fails, so the
  // error can name the ranks that never arrived. Optional.
  std::shared_ptr<Store> store;
};

class Communicator {
 public:
  // Takes a connected backend; starts the comm thread.
  Communicator(std::unique_ptr<Backend> backend, CommunicatorOptions options);
  // Finishes queued operations (or fails them if broken), then joins.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const char* backend_name() const { return backend_name_; }
  const std::string& name() const { return options_.name; }
  Duration timeout() const { return options_.timeout; }

  // ready (see Op::ready): the fence the collective waits for before it
  // touches its buffers, so a caller can queue it before its device has
  // produced `data`; null: the buffers are ready now.
  Work allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, FencePtr ready = nullptr);
  Work reduce_scatter(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                      FencePtr ready = nullptr);
  Work allgather(const void* input, void* output, std::size_t count, DType dtype, FencePtr ready = nullptr);
  Work broadcast(void* data, std::size_t count, DType dtype, int root, FencePtr ready = nullptr);
  Work barrier();

  // Sequence number of the last operation submitted (0 before any).
  std::uint64_t last_seq() const;
  // Time and bytes per operation kind so far (comm/op_stats.h); any thread.
  const OpStats& op_stats() const;
  // Told of every completed operation on the comm thread (null: none); the
  // observer must outlive the communicator or be reset to null first.
  void set_op_observer(OpObserver* observer);

 private:
  Work submit(Op op);

  CommunicatorOptions options_;
  int rank_;
  int world_size_;
  const char* backend_name_;
  std::unique_ptr<CommThread> thread_;
};

}  // namespace dtrain::comm
