// What a communicator's collectives cost: per operation kind, how many ran,
// how many bytes they moved and how long the comm thread spent in them; and
// an optional observer told of every completed operation with its real start
// and end (the trace, worker/trace.h).
//
// Bytes are nccl-tests' "size" of the operation: the whole buffer, i.e.
// count x element size for allreduce and broadcast, and world_size x count x
// element size for reduce_scatter (its input) and allgather (its output).
// Bus bandwidth (busbw) is then bytes / seconds x bus_factor(kind, world),
// with nccl-tests' factors, so it compares across world sizes.
//
// Threading: add() and the observer run on the comm thread only; totals()
// may be read from any thread at any time (relaxed atomics: each field is
// exact, the three fields of one kind may be one operation apart).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "comm/backend.h"

namespace dtrain::comm {

// Every collective kind, in OpKind's order (so static_cast<std::size_t>(kind)
// indexes per-kind arrays); op_kind_name() names them. The one list that
// counters, metrics snapshots and pages iterate.
inline constexpr std::array<OpKind, 5> kOpKinds = {OpKind::allreduce, OpKind::reduce_scatter, OpKind::allgather,
                                                   OpKind::broadcast, OpKind::barrier};
inline constexpr int kNumOpKinds = static_cast<int>(kOpKinds.size());
static_assert(
    [] {
      for (std::size_t i = 0; i < kOpKinds.size(); ++i) {
        if (static_cast<std::size_t>(kOpKinds[i]) != i) return false;
      }
      return true;
    }(),
    "kOpKinds must list every OpKind in its order");

// A completed operation, as the comm thread ran it.
struct OpTiming {
  OpKind kind = OpKind::barrier;
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;  // see the header comment
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
};

// Told of every operation that completed without error. Called on the comm
// thread: it must be quick and must not allocate per call.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void on_op(const OpTiming& op) = 0;
};

// nccl-tests' bus factor: 2(n-1)/n for allreduce, (n-1)/n for reduce_scatter
// and allgather, 1 for broadcast, 0 for barrier.
inline double bus_factor(OpKind kind, int world_size) {
  const double n = world_size;
  switch (kind) {
    case OpKind::allreduce: return n > 1 ? 2.0 * (n - 1) / n : 0.0;
    case OpKind::reduce_scatter:
    case OpKind::allgather: return n > 1 ? (n - 1) / n : 0.0;
    case OpKind::broadcast: return 1.0;
    case OpKind::barrier: return 0.0;
  }
  return 0.0;
}

// The size of `op` on `world_size` ranks, as defined above.
inline std::uint64_t op_size_bytes(const Op& op, int world_size) {
  const bool per_rank = op.kind == OpKind::reduce_scatter || op.kind == OpKind::allgather;
  return static_cast<std::uint64_t>(op.bytes()) * static_cast<std::uint64_t>(per_rank ? world_size : 1);
}

class OpStats {
 public:
  struct Totals {
    std::uint64_t count = 0;
    std::uint64_t bytes = 0;
    double seconds = 0.0;
  };

  void add(OpKind kind, std::uint64_t bytes, std::chrono::steady_clock::duration elapsed) {
    Slot& s = slots_[static_cast<std::size_t>(kind)];
    s.count.fetch_add(1, std::memory_order_relaxed);
    s.bytes.fetch_add(bytes, std::memory_order_relaxed);
    s.nanos.fetch_add(static_cast<std::uint64_t>(std::chrono::nanoseconds(elapsed).count()),
                      std::memory_order_relaxed);
  }

  Totals totals(OpKind kind) const {
    const Slot& s = slots_[static_cast<std::size_t>(kind)];
    return {s.count.load(std::memory_order_relaxed), s.bytes.load(std::memory_order_relaxed),
            1e-9 * static_cast<double>(s.nanos.load(std::memory_order_relaxed))};
  }

 private:
  struct Slot {
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::uint64_t> nanos{0};
  };
  std::array<Slot, kNumOpKinds> slots_;
};

}  // namespace dtrain::comm
