// Console: the agent's one way to write to its stdout, shared by the
// supervision loop and the log pump thread; whole lines, never interleaved.
#pragma once

#include <cstdio>
#include <mutex>
#include <string>

#include <fmt/format.h>

namespace dtrain::launcher {

class Console {
 public:
  // Writes `text` and a newline to stdout, flushed. Thread-safe.
  void line(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu_);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  // "dtrain-launch: " + text: the agent's own status lines.
  void say(const std::string& text) { line("dtrain-launch: " + text); }

 private:
  std::mutex mu_;
};

}  // namespace dtrain::launcher
