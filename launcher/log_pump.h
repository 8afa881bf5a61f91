// LogPump: copies the workers' output (one pipe per rank, stdout and stderr
// together) line by line to LOG_DIR/rank_K.log and to the console prefixed
// "[rank K]", except a line that already starts with the rank's own
// "[rankK]:" (PyTorch prefixes its lines so): one prefix is enough. One
// thread per round; a line longer than 64 KiB is split.
//
// Lifetime: construct after the workers were spawned (it owns the read ends
// of their pipes); finish() waits for the pipes' end of file up to a
// deadline (a worker's child may hold a pipe open), then closes them.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "launcher/console.h"

namespace dtrain::launcher {

struct LogSource {
  int fd = -1;                 // read end of the rank's pipe; the pump closes it
  int rank = 0;
  std::filesystem::path file;  // LOG_DIR/rank_K.log
};

class LogPump {
 public:
  // Opens every file for appending (at round 0 the agent has moved an
  // earlier job's aside: keep_previous_log) and starts the thread. Throws
  // IoError naming a file that cannot be opened.
  LogPump(std::vector<LogSource> sources, Console& console);
  ~LogPump();
  LogPump(const LogPump&) = delete;
  LogPump& operator=(const LogPump&) = delete;

  // Copies what is left until every pipe is at end of file or `timeout`
  // passes, then stops the thread and closes everything. Idempotent.
  void finish(std::chrono::milliseconds timeout);

 private:
  struct Stream {
    LogSource source;
    int file_fd = -1;
    std::string partial;  // a line not yet ended
    bool open = true;
  };
  void run();
  bool drain(Stream& s);  // reads what is there; false at end of file
  void emit(Stream& s, const std::string& line);

  std::vector<Stream> streams_;
  Console& console_;
  std::atomic<bool> finishing_{false};
  std::atomic<std::int64_t> deadline_ns_{0};
  std::thread thread_;
};

// A new job's log starts empty and earlier jobs' stay: `file` becomes
// file.1, file.1 becomes file.2, and so on (file.1 is always the latest
// earlier job). Nothing happens when `file` does not exist. Throws IoError
// naming the file that cannot be renamed.
void keep_previous_log(const std::filesystem::path& file);

// The console's line for `line` of `rank`: "[rank K] line", or the line as it
// is when it starts with "[rankK]:".
std::string console_line(int rank, const std::string& line);

// The last `lines` lines of `file` ("" when it cannot be read).
std::string tail_lines(const std::filesystem::path& file, int lines);

}  // namespace dtrain::launcher
