// Collectives checked against closed-form results, shared by the thread-based
// gloo tests and the multi-process mpi tests (tests/programs/comm_conformance).
// Every rank runs the same list of cases in the same order.
//
// Inputs are small integers, v(r, i) = ((r + 1) * (i % 5 + 1)) % 13 - 6, so
// every sum over <= 8 ranks is exact in f32, bf16 and f16 and the expected
// value does not depend on the order of additions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "core/dtype.h"

namespace dtrain::testing {

struct CollectiveCase {
  comm::OpKind kind = comm::OpKind::allreduce;
  DType dtype = DType::f32;
  comm::ReduceOp op = comm::ReduceOp::sum;
  std::size_t count = 0;
  bool in_place = false;
  int root = 0;

  std::string describe() const {
    return fmt::format("{} {} {} count={}{} root={}", comm::op_kind_name(kind), dtype_name(dtype),
                       comm::reduce_op_name(op), count, in_place ? " in-place" : "", root);
  }
};

inline float input_value(int rank, std::size_t i) {
  return static_cast<float>(((rank + 1) * static_cast<int>(i % 5 + 1)) % 13 - 6);
}

inline void store_value(void* data, DType dtype, std::size_t i, float v) {
  if (dtype == DType::f32) {
    static_cast<float*>(data)[i] = v;
  } else {
    static_cast<std::uint16_t*>(data)[i] = dtype == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
}

inline float load_value(const void* data, DType dtype, std::size_t i) {
  if (dtype == DType::f32) return static_cast<const float*>(data)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(data)[i];
  return dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// The reduction of every rank's v(r, i), rounded to the dtype as the
// backends do (f32 accumulate, then scale by 1/world for avg, then round).
inline float reduced_value(int world, std::size_t i, comm::ReduceOp op, DType dtype) {
  float acc = input_value(0, i);
  for (int r = 1; r < world; ++r) {
    acc = op == comm::ReduceOp::max ? std::max(acc, input_value(r, i)) : acc + input_value(r, i);
  }
  if (op == comm::ReduceOp::avg) acc *= 1.0f / static_cast<float>(world);
  if (dtype == DType::bf16) return bf16_to_f32(f32_to_bf16(acc));
  if (dtype == DType::f16) return f16_to_f32(f32_to_f16(acc));
  return acc;
}

inline float rounded(float v, DType dtype) {
  if (dtype == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Runs one case on `comm`; returns the number of wrong elements on this rank
// (a clobbered guard element past the end counts as one).
inline std::size_t run_collective_case(comm::Communicator& comm, const CollectiveCase& c) {
  constexpr std::uint8_t kGuard = 0xAB;
  const int rank = comm.rank();
  const int world = comm.world_size();
  const std::size_t n = c.count;
  const std::size_t esize = dtype_size(c.dtype);
  const std::size_t world_n = n * static_cast<std::size_t>(world);
  // Reused across cases (fresh pages cost ~15 us each); refilled every time.
  thread_local std::vector<std::uint8_t> in, out;
  const std::size_t bytes = (world_n + 1) * esize;
  if (in.size() < bytes) {
    in.resize(bytes);
    out.resize(bytes);
  }
  std::memset(in.data(), kGuard, bytes);
  std::memset(out.data(), kGuard, bytes);
  std::uint8_t* const own_in = in.data() + static_cast<std::size_t>(rank) * n * esize;
  std::uint8_t* const own_out = out.data() + static_cast<std::size_t>(rank) * n * esize;
  std::size_t wrong = 0;
  const std::uint8_t* guard = nullptr;  // the element just past what the op may write
  switch (c.kind) {
    case comm::OpKind::allreduce:
      for (std::size_t i = 0; i < n; ++i) store_value(in.data(), c.dtype, i, input_value(rank, i));
      comm.allreduce(in.data(), n, c.dtype, c.op).wait();
      for (std::size_t i = 0; i < n; ++i) {
        wrong += load_value(in.data(), c.dtype, i) != reduced_value(world, i, c.op, c.dtype);
      }
      guard = in.data() + n * esize;
      break;
    case comm::OpKind::reduce_scatter: {
      for (std::size_t i = 0; i < world_n; ++i) store_value(in.data(), c.dtype, i, input_value(rank, i));
      void* target = c.in_place ? own_in : out.data();
      comm.reduce_scatter(in.data(), target, n, c.dtype, c.op).wait();
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t global = static_cast<std::size_t>(rank) * n + i;
        wrong += load_value(target, c.dtype, i) != reduced_value(world, global, c.op, c.dtype);
      }
      guard = c.in_place ? in.data() + world_n * esize : out.data() + n * esize;
      break;
    }
    case comm::OpKind::allgather: {
      void* source = c.in_place ? own_out : in.data();
      for (std::size_t i = 0; i < n; ++i) store_value(source, c.dtype, i, input_value(rank, i));
      comm.allgather(source, out.data(), n, c.dtype).wait();
      for (int q = 0; q < world; ++q) {
        for (std::size_t i = 0; i < n; ++i) {
          const float got = load_value(out.data(), c.dtype, static_cast<std::size_t>(q) * n + i);
          wrong += got != rounded(input_value(q, i), c.dtype);
        }
      }
      guard = out.data() + world_n * esize;
      break;
    }
    case comm::OpKind::broadcast:
      for (std::size_t i = 0; i < n; ++i) {
        store_value(in.data(), c.dtype, i, rank == c.root ? input_value(c.root, i) : 99.0f);
      }
      comm.broadcast(in.data(), n, c.dtype, c.root).wait();
      for (std::size_t i = 0; i < n; ++i) {
        wrong += load_value(in.data(), c.dtype, i) != rounded(input_value(c.root, i), c.dtype);
      }
      guard = in.data() + n * esize;
      break;
    case comm::OpKind::barrier:
      comm.barrier().wait();
      break;
  }
  if (guard != nullptr) {
    for (std::size_t b = 0; b < esize; ++b) {
      if (guard[b] != kGuard) {
        ++wrong;
        break;
      }
    }
  }
  return wrong;
}

// Counts: empty, tiny, primes, counts not divisible by the world size, and
// (when `large`) 64 MiB of f32.
inline std::vector<std::size_t> collective_counts(bool large) {
  std::vector<std::size_t> counts = {0, 1, 2, 3, 5, 7, 13, 31, 127, 1009, 65537, 1000003};
  if (large) counts.push_back(std::size_t{16} << 20);  // 64 MiB of f32
  return counts;
}

inline std::vector<CollectiveCase> collective_cases(int world, bool large) {
  std::vector<CollectiveCase> cases;
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  const comm::ReduceOp ops[] = {comm::ReduceOp::sum, comm::ReduceOp::avg, comm::ReduceOp::max};
  for (std::size_t count : collective_counts(large)) {
    const bool huge = count > (std::size_t{1} << 22);
    for (DType dtype : dtypes) {
      if (huge && dtype != DType::f32) continue;  // the 64 MiB case is f32
      for (comm::ReduceOp op : ops) {
        if (huge && op != comm::ReduceOp::sum) continue;
        cases.push_back({comm::OpKind::allreduce, dtype, op, count, true, 0});
        // reduce_scatter / allgather take a per-rank count: the big case is 64 MiB in total
        const std::size_t per_rank = huge ? count / static_cast<std::size_t>(world) : count;
        cases.push_back({comm::OpKind::reduce_scatter, dtype, op, per_rank, false, 0});
        if (!huge) cases.push_back({comm::OpKind::reduce_scatter, dtype, op, per_rank, true, 0});
      }
      const std::size_t per_rank = huge ? count / static_cast<std::size_t>(world) : count;
      cases.push_back({comm::OpKind::allgather, dtype, comm::ReduceOp::sum, per_rank, false, 0});
      if (!huge) cases.push_back({comm::OpKind::allgather, dtype, comm::ReduceOp::sum, per_rank, true, 0});
      cases.push_back({comm::OpKind::broadcast, dtype, comm::ReduceOp::sum, count, true, 0});
      if (!huge) cases.push_back({comm::OpKind::broadcast, dtype, comm::ReduceOp::sum, count, true, world - 1});
    }
  }
  cases.push_back({comm::OpKind::barrier, DType::f32, comm::ReduceOp::sum, 0, false, 0});
  return cases;
}

}  // namespace dtrain::testing
