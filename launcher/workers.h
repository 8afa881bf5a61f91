// WorkerGroup: this node's worker processes for one rendezvous round.
//
// Each worker runs in its own process group (so a signal reaches whatever it
// started too) with PR_SET_PDEATHSIG(SIGKILL) (so it dies with the agent,
// even when the agent is killed with SIGKILL); its stdout and stderr go
// through a pipe to the LogPump. Only the thread that called start() may be
// the one the workers' death signal is tied to: call it from the agent's
// main thread, which lives as long as the agent.
//
// Not thread-safe: the agent's supervision loop owns a group.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/console.h"
#include "launcher/log_pump.h"

namespace dtrain::launcher {

struct WorkerSpec {
  int rank = 0;
  std::map<std::string, std::string> env;  // added to the group's base environment
};

struct WorkerExit {
  int rank = 0;
  pid_t pid = -1;
  int status = 0;  // waitpid status
  bool ok() const;
  std::string describe() const;  // "exit code 3", "signal SIGKILL"
};

// "SIGKILL" for 9; "signal 77" for a number without a name.
std::string signal_name(int signal);

// The file a worker's exec runs for `program` under the search path `path`
// (PATH's value): `program` itself when it names a folder, else the first
// executable `<entry>/program`; nullopt when there is none.
std::optional<std::filesystem::path> find_program(const std::string& program, const std::string& path);

class WorkerGroup {
 public:
  explicit WorkerGroup(Console& console) : console_(console) {}
  ~WorkerGroup();  // kills (SIGKILL) and reaps whatever still runs
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts `command` once per spec with `base_env` plus the spec's variables,
  // output to log_dir/rank_K.log and the console. Throws IoError when a
  // process cannot be started (and kills those already started).
  void start(const std::vector<std::string>& command, const std::map<std::string, std::string>& base_env,
             const std::vector<WorkerSpec>& specs, const std::filesystem::path& log_dir);

  // Reaps exited workers without blocking; returns those that exited since the last call.
  std::vector<WorkerExit> reap();
  bool all_exited() const;
  int running() const;  // workers not yet reaped
  bool all_succeeded() const;  // every worker exited with code 0

  // Sends `signal` to every running worker's process group; a group that
  // cannot be signalled is named on the console, not thrown.
  void signal_all(int signal);
  // SIGTERM (unless `first` says otherwise), up to `grace` for the workers
  // to exit, SIGKILL for the rest; reaps all and finishes the log pump.
  void stop(std::chrono::milliseconds grace, int first = 15);
  // Reaps nothing; waits for the log pump (after every worker exited).
  void finish_logs();

  std::vector<pid_t> pids() const;
  const std::filesystem::path& log_dir() const { return log_dir_; }

 private:
  struct Proc {
    int rank = 0;
    pid_t pid = -1;
    bool running = true;
    int status = 0;
  };
  std::vector<Proc> procs_;
  std::unique_ptr<LogPump> pump_;
  std::filesystem::path log_dir_;
  Console& console_;
};

}  // namespace dtrain::launcher
