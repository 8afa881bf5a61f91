// Real worker processes for multi-process tests: spawn with extra
// environment variables, output to a log file each, wait with a deadline
// (whatever is still running then is killed), wait for a line in a log, and
// a free loopback port.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dtrain::testing {

struct Spawned {
  pid_t pid = -1;
  std::string log_path;
  int status = -1;      // waitpid status once reaped
  bool reaped = false;

  bool exited() const { return reaped && WIFEXITED(status); }
  int exit_code() const { return exited() ? WEXITSTATUS(status) : -1; }
  bool killed_by(int sig) const { return reaped && WIFSIGNALED(status) && WTERMSIG(status) == sig; }
  // "exit 2", "killed by signal 13 (Broken pipe)" or "not reaped": for messages.
  std::string outcome() const {
    if (!reaped) return "not reaped";
    if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
      return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
    }
    return "status " + std::to_string(status);
  }
  std::string log() const {
    std::ifstream in(log_path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

// Starts argv[0] with the current environment plus `env`, stdout and stderr
// to `log_path`.
inline Spawned spawn_process(const std::vector<std::string>& argv,
                             const std::map<std::string, std::string>& env, const std::string& log_path) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (env.count(entry.substr(0, entry.find('='))) == 0) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  Spawned s;
  s.log_path = log_path;
  const int rc = posix_spawn(&s.pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn failed for " + argv[0]);
  return s;
}

// Reaps every process, waiting up to `deadline` in all; kills (SIGKILL) and
// reaps whatever is left then. Returns false when something had to be killed.
inline bool wait_all(std::vector<Spawned>& procs, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  bool all = true;
  for (;;) {
    bool pending = false;
    for (auto& p : procs) {
      if (p.reaped) continue;
      if (::waitpid(p.pid, &p.status, WNOHANG) == p.pid) {
        p.reaped = true;
      } else {
        pending = true;
      }
    }
    if (!pending) return all;
    if (std::chrono::steady_clock::now() > until) {
      all = false;
      for (auto& p : procs) {
        if (p.reaped) continue;
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, &p.status, 0);
        p.reaped = true;
      }
      return all;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Waits until a line of `path` holds a match of `pattern` and returns the match and its
// groups; empty when `timeout` passes first.
inline std::vector<std::string> wait_for_text(const std::string& path, const std::string& pattern,
                                              std::chrono::milliseconds timeout) {
  const std::regex re(pattern);
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::size_t lines_seen = 0;  // lines already searched (patterns match within one line)
  for (;;) {
    std::ifstream in(path);
    std::size_t n = 0;
    for (std::string line; std::getline(in, line); ++n) {
      std::smatch m;
      if (n < lines_seen || !std::regex_search(line, m, re)) continue;
      return std::vector<std::string>(m.begin(), m.end());
    }
    lines_seen = n > 0 ? n - 1 : 0;  // the last line may still be growing
    if (std::chrono::steady_clock::now() > until) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A TCP port on 127.0.0.1 that was free a moment ago.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace dtrain::testing
