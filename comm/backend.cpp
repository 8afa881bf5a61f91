#include "comm/backend.h"

#include <fmt/format.h>

namespace dtrain::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::allgather: return "allgather";
    case OpKind::broadcast: return "broadcast";
    case OpKind::barrier: return "barrier";
  }
  return "?";
}

std::string Op::describe() const {
  switch (kind) {
    case OpKind::barrier:
      return fmt::format("barrier #{}", seq);
    case OpKind::broadcast:
      return fmt::format("broadcast #{} ({} x {}, root {})", seq, dtype_name(dtype), count, root);
    case OpKind::allgather:
      return fmt::format("allgather #{} ({} x {} per rank)", seq, dtype_name(dtype), count);
    case OpKind::reduce_scatter:
      return fmt::format("reduce_scatter #{} ({} x {} per rank, {})", seq, dtype_name(dtype), count,
                         reduce_op_name(reduce));
    case OpKind::allreduce:
      return fmt::format("allreduce #{} ({} x {}, {})", seq, dtype_name(dtype), count,
                         reduce_op_name(reduce));
  }
  return "?";
}

std::size_t Op::bytes() const { return count * dtype_size(dtype); }

}  // namespace dtrain::comm
