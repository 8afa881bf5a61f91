#include "comm/comm_thread.h"

#include <atomic>

#include <fmt/format.h>

#include "comm/diagnosis.h"
#include "core/error.h"

namespace dtrain::comm {

void WorkState::complete(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    done = true;
    finished_at = std::chrono::steady_clock::now();
    if (!started) started_at = finished_at;
    error = std::move(e);
  }
  cv.notify_all();
}

void WorkState::set_launched(FencePtr fence) {
  {
    std::lock_guard<std::mutex> lock(mu);
    launched = std::move(fence);
  }
  cv.notify_all();
}

struct CommThread::Shared {
  std::unique_ptr<Backend> backend;
  CommunicatorOptions options;
  int rank = 0;
  int world_size = 1;
  std::string group;  // "communicator 'world' (gloo, ranks 0-3)"
  bool backend_enforces_deadline = true;
  bool backend_on_device = false;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<WorkState>> queue;
  std::shared_ptr<WorkState> current;
  bool current_failing = false;  // someone is already failing `current`
  std::uint64_t last_seq = 0;
  bool stopping = false;
  bool stuck = false;            // the watchdog gave up on a call that has not returned
  std::string broken;            // the first failure's message; empty while healthy
  OpStats stats;                 // written by the comm thread only
  std::atomic<OpObserver*> observer{nullptr};

  // Fails `work` with a diagnosed error and breaks the communicator.
  void fail(const std::shared_ptr<WorkState>& work, bool timed_out, const std::string& cause);
  // Fails `work` because an earlier operation broke the communicator.
  void fail_broken(const std::shared_ptr<WorkState>& work);
};

void CommThread::Shared::fail(const std::shared_ptr<WorkState>& work, bool timed_out,
                              const std::string& cause) {
  const Op& op = work->op;
  const ArrivalReport report =
      report_arrival(options.store.get(), options.name, rank, world_size, op.seq,
                     diagnosis_grace(options.timeout));
  std::string advice = report.missing.empty()
                           ? "check the network between the ranks and every rank's log"
                           : "look at the log of the rank(s) named: stuck, stopped or dead";
  std::string message = fmt::format(
      "rank {}: {} on {} {}: {}. {}; {}.", rank, op.describe(), group,
      timed_out ? fmt::format("timed out after {} ms", options.timeout.count()) : "failed", cause,
      report.text, advice);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.empty()) broken = message;
  }
  work->complete(timed_out ? std::make_exception_ptr(TimeoutError(message))
                           : std::make_exception_ptr(CommError(message)));
}

void CommThread::Shared::fail_broken(const std::shared_ptr<WorkState>& work) {
  std::string first;
  {
    std::lock_guard<std::mutex> lock(mu);
    first = broken.empty() ? "an operation timed out (its diagnosis is under way)" : broken;
  }
  work->complete(std::make_exception_ptr(CommError(fmt::format(
      "rank {}: {} on {} not run: the communicator failed earlier: {}", rank, work->op.describe(),
      group, first))));
}

Duration CommThread::diagnosis_grace(Duration timeout) {
  return std::min<Duration>(Duration(2000), timeout);
}

CommThread::CommThread(std::unique_ptr<Backend> backend, const CommunicatorOptions& options)
    : shared_(std::make_shared<Shared>()) {
  shared_->rank = backend->rank();
  shared_->world_size = backend->world_size();
  shared_->group = fmt::format("communicator '{}' ({}, ranks 0-{})", options.name, backend->name(),
                               backend->world_size() - 1);
  shared_->backend_enforces_deadline = backend->enforces_deadline();
  shared_->backend_on_device = backend->runs_on_device();
  shared_->backend = std::move(backend);
  shared_->options = options;
  worker_ = std::thread(run_loop, shared_);
  watchdog_ = std::thread(watchdog_loop, shared_);
}

CommThread::~CommThread() {
  bool stuck = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stopping = true;
    stuck = shared_->stuck;
  }
  shared_->cv.notify_all();
  watchdog_.join();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    stuck = shared_->stuck;
  }
  // A thread blocked in a library call cannot be joined; it keeps the shared
  // state (and the backend) alive and dies with the process.
  if (stuck) {
    worker_.detach();
  } else {
    worker_.join();
  }
}

std::shared_ptr<WorkState> CommThread::submit(Op op) {
  auto work = std::make_shared<WorkState>();
  work->on_device = shared_->backend_on_device;
  bool broken = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    op.seq = ++shared_->last_seq;
    work->op = op;
    broken = !shared_->broken.empty() || shared_->stuck;
    if (!broken) shared_->queue.push_back(work);
  }
  if (broken) {
    shared_->fail_broken(work);
  } else {
    shared_->cv.notify_all();
  }
  return work;
}

std::uint64_t CommThread::last_seq() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->last_seq;
}

const OpStats& CommThread::op_stats() const { return shared_->stats; }

void CommThread::set_observer(OpObserver* observer) { shared_->observer.store(observer); }

// Counts a completed operation and tells the observer (comm thread only).
void CommThread::record_completion(Shared& s, const Op& op, std::chrono::steady_clock::time_point started_at) {
  const auto now = std::chrono::steady_clock::now();
  const std::uint64_t bytes = op_size_bytes(op, s.world_size);
  s.stats.add(op.kind, bytes, now - started_at);
  if (OpObserver* observer = s.observer.load(std::memory_order_relaxed)) {
    observer->on_op(OpTiming{op.kind, op.seq, bytes, started_at, now});
  }
}

void CommThread::run_loop(std::shared_ptr<Shared> s) {
  for (;;) {
    std::shared_ptr<WorkState> work;
    bool broken = false;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return !s->queue.empty() || s->stopping; });
      if (s->queue.empty()) {
        // The watchdog may have gone back to sleep while operations were still
        // queued (failing them here notifies nobody): wake it to see the end.
        lock.unlock();
        s->cv.notify_all();
        return;
      }
      work = std::move(s->queue.front());
      s->queue.pop_front();
      broken = !s->broken.empty();
      if (!broken) {
        {
          // Work::wait reads the deadline under the work's own mutex.
          std::lock_guard<std::mutex> work_lock(work->mu);
          work->op.deadline = std::chrono::steady_clock::now() + s->options.timeout;
        }
        s->current = work;
        s->current_failing = false;
      }
    }
    if (broken) {
      s->fail_broken(work);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(work->mu);
      work->started = true;
      work->started_at = std::chrono::steady_clock::now();
    }
    s->cv.notify_all();  // the watchdog watches the new deadline
    bool timed_out = false;
    std::string cause;
    try {
      await_ready(*s, *work);
      const auto started_at = std::chrono::steady_clock::now();  // the transfer's time, not the wait's
      std::weak_ptr<WorkState> weak = work;
      work->op.launched = [weak](FencePtr done) {
        if (auto w = weak.lock()) w->set_launched(std::move(done));
      };
      s->backend->run(work->op);
      record_completion(*s, work->op, started_at);
    } catch (const TimeoutError& e) {
      timed_out = true;
      cause = e.what();
    } catch (const std::exception& e) {
      cause = e.what();
      if (cause.empty()) cause = "unknown error";
    }
    bool claimed = false;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      claimed = !s->current_failing;
      s->current_failing = true;
    }
    if (claimed && cause.empty()) work->complete(nullptr);
    if (claimed && !cause.empty()) s->fail(work, timed_out, cause);
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->current.reset();
    }
    s->cv.notify_all();
  }
}

// Waits on the host for the fence the operation's input depends on, unless
// the backend waits for a CUDA fence on its own stream (comm thread only).
void CommThread::await_ready(const Shared& s, const WorkState& work) {
  const FencePtr& ready = work.op.ready;
  if (ready == nullptr || (s.backend_on_device && ready->cuda_event() != nullptr)) return;
  if (!ready->wait_until(work.op.deadline)) {
    throw TimeoutError(fmt::format("its input was not ready (the device producing it did not reach the "
                                   "fence) within {} ms",
                                   s.options.timeout.count()));
  }
}

void CommThread::watchdog_loop(std::shared_ptr<Shared> s) {
  // Backends that enforce deadlines themselves get slack for their own error
  // and its diagnosis; the watchdog is then only a safety net.
  const Duration slack = s->backend_enforces_deadline
                             ? 2 * diagnosis_grace(s->options.timeout) + Duration(5000)
                             : Duration(0);
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    if (s->stopping && (s->current == nullptr || s->stuck) && (s->queue.empty() || s->stuck)) return;
    if (s->current == nullptr || s->current_failing) {
      s->cv.wait(lock);
      continue;
    }
    const auto deadline = s->current->op.deadline + slack;
    if (std::chrono::steady_clock::now() < deadline) {
      s->cv.wait_until(lock, deadline);
      continue;
    }
    std::shared_ptr<WorkState> work = s->current;
    s->current_failing = true;
    s->stuck = true;
    std::deque<std::shared_ptr<WorkState>> queued;
    queued.swap(s->queue);
    lock.unlock();
    s->fail(work, true, fmt::format("{} did not return", s->backend->name()));
    for (auto& w : queued) s->fail_broken(w);
    lock.lock();
  }
}

}  // namespace dtrain::comm
