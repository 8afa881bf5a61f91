// The comm thread behind a Communicator: a FIFO of operations run one at a
// time on the backend, and a watchdog that fails an operation still running
// past its deadline (for backends such as MPI whose calls cannot time out
// themselves) so that no Work waits forever.
//
// Threading: submit() may be called from any thread. The backend is touched
// only by the comm thread. State shared by the two threads lives in a
// shared_ptr, so a comm thread stuck inside a library call can be detached
// and outlive the Communicator safely.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/backend.h"
#include "comm/communicator.h"
#include "comm/op_stats.h"

namespace dtrain::comm {

struct WorkState {
  Op op;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  bool done = false;
  std::chrono::steady_clock::time_point started_at;   // when the comm thread began it
  std::chrono::steady_clock::time_point finished_at;  // when it completed or failed
  std::exception_ptr error;
  bool on_device = false;  // the backend runs on a device: `launched` comes before completion
  FencePtr launched;       // set once a device backend queued the collective

  // Publishes the device fence of a queued collective (Op::launched).
  void set_launched(FencePtr fence);

  // The first completion wins; later ones (a late backend return after the
  // watchdog failed the operation) are ignored.
  void complete(std::exception_ptr e);
};

class CommThread {
 public:
  CommThread(std::unique_ptr<Backend> backend, const CommunicatorOptions& options);
  ~CommThread();

  std::shared_ptr<WorkState> submit(Op op);
  std::uint64_t last_seq() const;
  // Per-kind totals of the operations that completed (comm/op_stats.h).
  const OpStats& op_stats() const;
  // Told of every completed operation from now on (null: none). The observer
  // must outlive this thread or be reset first.
  void set_observer(OpObserver* observer);

  // How long a failure's diagnosis may add to an operation's timeout.
  static Duration diagnosis_grace(Duration timeout);

 private:
  struct Shared;
  static void run_loop(std::shared_ptr<Shared> shared);
  static void watchdog_loop(std::shared_ptr<Shared> shared);
  static void await_ready(const Shared& s, const WorkState& work);
  static void record_completion(Shared& s, const Op& op, std::chrono::steady_clock::time_point started_at);

  std::shared_ptr<Shared> shared_;
  std::thread worker_;
  std::thread watchdog_;
};

}  // namespace dtrain::comm
