// Checkpoints of a training run (checkpoint.* config): every rank writes its
// owned slices in parallel, rank 0 commits the step once every rank's file is
// durable, and a resume reads whatever ranges the current world size and ZeRO
// stage need from whichever files hold them.
//
// Asynchronous saves (checkpoint.async): a background thread copies this
// rank's state into a reused host buffer, then writes and fsyncs the rank file
// while training goes on; the trainer calls before_update() before each
// optimizer update, which waits (rarely) for the copy to be complete. The background thread only writes: gathering
// every rank's records and the commit stay on the training thread
// (advance), because collectives issued from two threads could reach the
// ranks in different orders; rank 0's commit (manifest, renames, fsyncs) then
// runs on the background thread too. The trainer advances a save at each step
// boundary where every rank's part is done (agreed through the step's loss
// all-reduce), finishes it before the next save and before it returns. At
// most one save is in flight.
//
// One training thread per rank calls everything; all ranks call save(),
// start_save(), finish_save() and resume() together (they are collective).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/env.h"
#include "comm/communicator.h"
#include "proto/config.pb.h"
#include "sharding/engine.h"

namespace dtrain::worker {

struct ResumePoint {
  std::int64_t step = 0;            // optimizer steps done
  std::int64_t data_position = 0;   // global sample index of the next batch
  std::filesystem::path dir;        // the step directory loaded
  std::int64_t optimizer_step = 0;  // updates applied (AdamW's t; below step after skipped fp16 steps)
  std::int64_t saved_train_steps = 0;  // train.steps of the run that saved it (0: unknown)
};

// What the last committed save cost this rank.
struct SaveTimes {
  std::int64_t step = -1;
  std::uint64_t bytes = 0;      // this rank's file
  double blocked_s = 0.0;       // the training thread waited this long (all of a sync save;
                                // for an async save, start_save, before_update and the commit)
  double write_s = 0.0;         // writing and fsyncing the rank file
};

class Checkpointer {
 public:
  // `env`: where files go (null: the real file system); must outlive this.
  Checkpointer(const config::Config& config, sharding::Engine& engine, comm::Communicator& comm,
               checkpoint::Env* env = nullptr);
  // Waits for a background write still running; it does not commit (that is
  // collective): a save not finished by finish_save() stays uncommitted.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Loads the checkpoint checkpoint.resume names ("auto": the newest committed
  // step that verifies; a path: exactly that step) into the engine. nullopt:
  // nothing to resume ("none", or "auto" with no checkpoint yet).
  std::optional<ResumePoint> resume(std::ostream* console);

  // Whether step `step` (just done) is one to save at.
  bool due(std::int64_t step) const;
  // Saves the engine's state after `step` steps and commits it (a save in
  // flight is finished first); rank 0 then deletes committed steps beyond
  // checkpoint.keep_last. Any rank's failure is an IoError on every rank.
  void save(std::int64_t step, std::int64_t data_position, std::int64_t optimizer_step);

  // Finishes a save in flight, then starts copying the engine's state and
  // writing it in the background. Forward and backward may run as soon as
  // this returns; anything that changes the saved state (the optimizer
  // update, a load) must call before_update() first.
  void start_save(std::int64_t step, std::int64_t data_position, std::int64_t optimizer_step);
  // Waits until a save in flight has copied the engine's state (no-op when
  // it has, or when nothing is in flight); the wait counts as blocked time.
  void before_update();
  // A save is in flight (same answer on every rank).
  bool in_flight() const { return pending_.has_value(); }
  // This rank's part of the save's current phase is done (or nothing is in
  // flight): once true on every rank, advance() will not wait. Any thread.
  bool ready() const { return !pending_ || done_.load(std::memory_order_acquire); }
  // Moves the save in flight to its next phase (write -> commit -> done);
  // waits for this rank's background work if it is not ready. Collective.
  void advance();
  // advance() until nothing is in flight (no-op when nothing is).
  void finish_save();

  const SaveTimes& last_save() const { return last_save_; }
  const std::filesystem::path& root() const { return root_; }

  // Told of each part of a save the training thread spends (for the trace
  // and the profile, worker/trace.h): "checkpoint write" (a save's own
  // file, synchronous saves), "checkpoint gather" (every rank's records),
  // "checkpoint commit" (rank 0's commit, learned by every rank),
  // "checkpoint start" (an asynchronous save's start) and "checkpoint copy
  // wait" (before_update waiting for the copy). Names are string literals.
  // The background thread's copy and write are not reported.
  using PhaseObserver = std::function<void(const char* name, std::chrono::steady_clock::time_point start,
                                           std::chrono::steady_clock::time_point end)>;
  void set_phase_observer(PhaseObserver observer) { phase_observer_ = std::move(observer); }

 private:
  enum class Phase { writing, committing };
  struct Pending {
    std::int64_t step = 0;
    std::int64_t data_position = 0;
    std::int64_t optimizer_step = 0;
    double blocked_s = 0.0;
    Phase phase = Phase::writing;
  };
  void begin(std::int64_t step);
  void capture_run_state();
  std::vector<checkpoint::RangeData> snapshot(const std::vector<sharding::StateSlice>& slices);
  std::string write_part(std::int64_t step, const std::vector<checkpoint::RangeData>& ranges);
  checkpoint::Manifest manifest_from(const std::vector<std::string>& parts, const Pending& pending) const;
  std::string try_load(const std::filesystem::path& dir, checkpoint::Manifest* manifest);
  void set_aside_corrupt_steps(std::int64_t resumed_step, std::ostream* console);
  void phase_done(const char* name, std::chrono::steady_clock::time_point start) const;

  const config::Config& config_;
  sharding::Engine& engine_;
  comm::Communicator& comm_;
  checkpoint::Env& env_;
  std::filesystem::path root_;
  std::vector<checkpoint::StepReport> set_aside_;  // steps resume=auto skipped

  // The save in flight. The background thread (worker_) writes this rank's
  // file from snapshot_, then (rank 0) commits; it sets its results before done_.
  std::vector<float> snapshot_;
  std::optional<Pending> pending_;
  std::thread worker_;
  std::atomic<bool> copied_{true};  // the background thread has copied the state
  std::atomic<bool> done_{false};
  std::string written_part_;
  double work_seconds_ = 0.0;
  std::string commit_error_;
  checkpoint::Manifest run_state_;  // captured with the snapshot
  SaveTimes last_save_;
  PhaseObserver phase_observer_;
};

}  // namespace dtrain::worker
