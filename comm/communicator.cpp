#include "comm/communicator.h"

#include <fmt/format.h>

#include "comm/comm_thread.h"
#include "core/error.h"

namespace dtrain::comm {

void Work::wait() {
  DTRAIN_CHECK(state_ != nullptr, "wait() on an empty Work");
  std::unique_lock<std::mutex> lock(state_->mu);
  // The comm thread's watchdog completes every operation by its deadline
  // plus the diagnosis; this loop only guards against a bug there.
  for (;;) {
    if (state_->cv.wait_for(lock, std::chrono::seconds(1), [&] { return state_->done; })) break;
    const auto limit = state_->op.deadline + std::chrono::minutes(2);
    if (state_->started && std::chrono::steady_clock::now() > limit) {
      throw TimeoutError(fmt::format("{} was not completed by the comm thread long after its deadline",
                                     state_->op.describe()));
    }
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

void Work::wait(Duration timeout) {
  DTRAIN_CHECK(state_ != nullptr, "wait() on an empty Work");
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) {
    throw TimeoutError(fmt::format("{} not complete after {} ms (still {}); it goes on in the background",
                                   state_->op.describe(), timeout.count(),
                                   state_->started ? "running" : "queued"));
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::completed() const {
  if (state_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

bool Work::started() const {
  if (state_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->started || state_->done;
}

double Work::run_seconds() const {
  if (state_ == nullptr) return 0.0;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done) return 0.0;
  return std::chrono::duration<double>(state_->finished_at - state_->started_at).count();
}

namespace {

// Reached when a host backend's operation completes; rethrows its error.
class CompletionFence final : public Fence {
 public:
  explicit CompletionFence(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  bool wait_until(Clock::time_point deadline) const override {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) return false;
    if (state_->error) std::rethrow_exception(state_->error);
    return true;
  }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace

FencePtr Work::done_fence() const {
  DTRAIN_CHECK(state_ != nullptr, "done_fence() on an empty Work");
  if (!state_->on_device) return std::make_shared<CompletionFence>(state_);
  std::unique_lock<std::mutex> lock(state_->mu);
  for (;;) {  // bounded like wait(): the comm thread launches or fails it by its deadline
    if (state_->cv.wait_for(lock, std::chrono::seconds(1), [&] { return state_->launched || state_->done; })) break;
    const auto limit = state_->op.deadline + std::chrono::minutes(2);
    if (state_->started && std::chrono::steady_clock::now() > limit) {
      throw TimeoutError(fmt::format("{} was not launched by the comm thread long after its deadline",
                                     state_->op.describe()));
    }
  }
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->launched;  // null: it completed without a device fence
}

std::uint64_t Work::seq() const { return state_ == nullptr ? 0 : state_->op.seq; }

Communicator::Communicator(std::unique_ptr<Backend> backend, CommunicatorOptions options)
    : options_(std::move(options)),
      rank_(backend->rank()),
      world_size_(backend->world_size()),
      backend_name_(backend->name()),
      thread_(std::make_unique<CommThread>(std::move(backend), options_)) {}

Communicator::~Communicator() = default;

std::uint64_t Communicator::last_seq() const { return thread_->last_seq(); }

const OpStats& Communicator::op_stats() const { return thread_->op_stats(); }

void Communicator::set_op_observer(OpObserver* observer) { thread_->set_observer(observer); }

Work Communicator::submit(Op op) {
  const bool reduces = op.kind == OpKind::allreduce || op.kind == OpKind::reduce_scatter;
  if (reduces && op.dtype != DType::f32 && op.dtype != DType::bf16 && op.dtype != DType::f16) {
    throw CommError(fmt::format("{} on {}: reductions take f32, bf16 or f16 buffers", op_kind_name(op.kind),
                                dtype_name(op.dtype)));
  }
  return Work(thread_->submit(std::move(op)));
}

namespace {

Op make_op(OpKind kind, const void* input, void* output, std::size_t count, DType dtype, FencePtr ready,
           ReduceOp reduce = ReduceOp::sum, int root = 0) {
  return Op{.kind = kind, .input = input, .output = output, .count = count, .dtype = dtype, .reduce = reduce,
            .root = root, .ready = std::move(ready)};
}

}  // namespace

Work Communicator::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, FencePtr ready) {
  return submit(make_op(OpKind::allreduce, data, data, count, dtype, std::move(ready), op));
}

Work Communicator::reduce_scatter(const void* input, void* output, std::size_t count, DType dtype,
                                  ReduceOp op, FencePtr ready) {
  return submit(make_op(OpKind::reduce_scatter, input, output, count, dtype, std::move(ready), op));
}

Work Communicator::allgather(const void* input, void* output, std::size_t count, DType dtype, FencePtr ready) {
  return submit(make_op(OpKind::allgather, input, output, count, dtype, std::move(ready)));
}

Work Communicator::broadcast(void* data, std::size_t count, DType dtype, int root, FencePtr ready) {
  DTRAIN_CHECK(root >= 0 && root < world_size_, "broadcast root {} outside 0..{}", root,
               world_size_ - 1);
  return submit(make_op(OpKind::broadcast, data, data, count, dtype, std::move(ready), ReduceOp::sum, root));
}

Work Communicator::barrier() {
  return submit(make_op(OpKind::barrier, nullptr, nullptr, 0, DType::f32, nullptr));
}

}  // namespace dtrain::comm
