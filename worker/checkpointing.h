// Checkpoints of a training run (checkpoint.* config): every rank writes its
// owned slices in parallel, rank 0 commits the step once every rank's file is
// durable, and a resume reads whatever ranges the current world size and ZeRO
// stage need from whichever files hold them.
// One training thread per rank calls everything; all ranks call save()
// together (it is collective).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>
#include <ostream>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "proto/config.pb.h"
#include "sharding/engine.h"

namespace dtrain::worker {

struct ResumePoint {
  std::int64_t step = 0;            // optimizer steps done
  std::int64_t data_position = 0;   // global sample index of the next batch
  std::filesystem::path dir;        // the step directory loaded
};

class Checkpointer {
 public:
  Checkpointer(const config::Config& config, sharding::Engine& engine, comm::Communicator& comm);

  // Loads the checkpoint checkpoint.resume names ("auto": the newest committed
  // step that verifies; a path: exactly that step) into the engine. nullopt:
  // nothing to resume ("none", or "auto" with no checkpoint yet).
  std::optional<ResumePoint> resume(std::ostream* console);

  // Whether step `step` (just done) is one to save at.
  bool due(std::int64_t step) const;
  // Saves the engine's state after `step` steps (collective); rank 0 commits
  // it and then deletes committed steps beyond checkpoint.keep_last.
  void save(std::int64_t step, std::int64_t data_position);

  const std::filesystem::path& root() const { return root_; }

 private:
  const config::Config& config_;
  sharding::Engine& engine_;
  comm::Communicator& comm_;
  void set_aside_corrupt_steps(std::int64_t resumed_step, std::ostream* console);

  std::filesystem::path root_;
  std::vector<checkpoint::StepReport> set_aside_;  // steps resume=auto skipped
};

}  // namespace dtrain::worker
