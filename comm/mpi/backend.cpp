#include "comm/mpi/backend.h"

#include <climits>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

// Wraps an MPI call: a failure throws CommError with the call, file:line and
// MPI's own error text.
#define DTRAIN_MPI_CHECK(call)                                                      \
  do {                                                                              \
    const int _rc = (call);                                                         \
    if (_rc != MPI_SUCCESS) ::dtrain::comm::mpi_backend::throw_mpi_error(_rc, #call, __FILE__, __LINE__); \
  } while (0)

namespace dtrain::comm::mpi_backend {

[[noreturn]] void throw_mpi_error(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(fmt::format("mpi: {} failed at {}:{}: {}", call, file, line, std::string(text, len)));
}

namespace {

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

// MPI counts are int: larger operations run in pieces of at most this many elements.
constexpr std::size_t kMaxPiece = std::size_t{1} << 30;

}  // namespace

bool default_yield_when_idle() {
  constexpr const char* kVariable = "OMPI_MCA_mpi_yield_when_idle";
  if (std::getenv(kVariable) != nullptr) return false;
  return setenv(kVariable, "1", /*overwrite=*/0) == 0;
}

MpiBackend::MpiBackend() {
  int initialised = 0;
  DTRAIN_MPI_CHECK(MPI_Initialized(&initialised));
  if (!initialised) {
    default_yield_when_idle();
    int provided = 0;
    DTRAIN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    initialised_here_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      throw CommError(fmt::format(
          "mpi: this Open MPI provides thread level {} but dtrain's comm thread needs "
          "MPI_THREAD_SERIALIZED ({})", provided, MPI_THREAD_SERIALIZED));
    }
  }
  // Errors come back as codes (then exceptions) instead of aborting the job.
  DTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  DTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  DTRAIN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
}

MpiBackend::~MpiBackend() {
  if (initialised_here_) MPI_Finalize();
}

void MpiBackend::run(const Op& op) {
  switch (op.kind) {
    case OpKind::allreduce: return allreduce(op);
    case OpKind::reduce_scatter: return reduce_scatter(op);
    case OpKind::allgather: return allgather(op);
    case OpKind::broadcast: return broadcast(op);
    case OpKind::barrier: DTRAIN_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); return;
  }
}

void MpiBackend::allreduce(const Op& op) {
  if (op.count == 0) return;
  const float scale = op.reduce == ReduceOp::avg ? 1.0f / static_cast<float>(world_size_) : 1.0f;
  float* data = op.dtype == DType::f32 ? static_cast<float*>(op.output) : staging_.floats(0, op.count);
  if (op.dtype != DType::f32) widen(op.output, op.dtype, data, op.count);
  for (std::size_t done = 0; done < op.count; done += kMaxPiece) {
    const int n = static_cast<int>(std::min(kMaxPiece, op.count - done));
    DTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, mpi_op(op.reduce), MPI_COMM_WORLD));
  }
  if (op.dtype != DType::f32) {
    narrow(data, scale, op.dtype, op.output, op.count);
  } else if (scale != 1.0f) {
    scale_f32(data, scale, op.count);
  }
}

void MpiBackend::reduce_scatter(const Op& op) {
  if (op.count == 0) return;
  DTRAIN_CHECK(op.count <= INT_MAX, "reduce_scatter of {} elements per rank exceeds MPI's int counts", op.count);
  const float scale = op.reduce == ReduceOp::avg ? 1.0f / static_cast<float>(world_size_) : 1.0f;
  const std::size_t total = op.count * static_cast<std::size_t>(world_size_);
  const float* input = static_cast<const float*>(op.input);
  if (op.dtype != DType::f32) {
    float* wide = staging_.floats(1, total);
    widen(op.input, op.dtype, wide, total);
    input = wide;
  }
  // The result goes to staging first: MPI forbids overlapping send and receive
  // buffers, and an in-place call has output inside input.
  float* result = staging_.floats(0, op.count);
  DTRAIN_MPI_CHECK(MPI_Reduce_scatter_block(input, result, static_cast<int>(op.count), MPI_FLOAT,
                                            mpi_op(op.reduce), MPI_COMM_WORLD));
  narrow(result, scale, op.dtype, op.output, op.count);
}

void MpiBackend::allgather(const Op& op) {
  if (op.count == 0) return;
  const std::size_t bytes = op.bytes();
  DTRAIN_CHECK(bytes <= INT_MAX, "allgather of {} bytes per rank exceeds MPI's int counts", bytes);
  auto* out = static_cast<std::uint8_t*>(op.output);
  const bool in_place = op.input == out + static_cast<std::size_t>(rank_) * bytes;
  DTRAIN_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : op.input, static_cast<int>(bytes), MPI_BYTE,
                                 out, static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD));
}

void MpiBackend::broadcast(const Op& op) {
  auto* data = static_cast<std::uint8_t*>(op.output);
  const std::size_t bytes = op.bytes();
  for (std::size_t done = 0; done < bytes; done += kMaxPiece) {
    const int n = static_cast<int>(std::min(kMaxPiece, bytes - done));
    DTRAIN_MPI_CHECK(MPI_Bcast(data + done, n, MPI_BYTE, op.root, MPI_COMM_WORLD));
  }
}

}  // namespace dtrain::comm::mpi_backend
