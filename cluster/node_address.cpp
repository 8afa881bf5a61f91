#include "cluster/node_address.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/syscall.h"

extern char** environ;

namespace dtrain::cluster {
namespace {

using Clock = std::chrono::steady_clock;

bool resolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  return rc == 0;
}

// Reads `fd` until end of file or the deadline; false when the deadline came first.
bool read_until(int fd, Clock::time_point deadline, std::string& out) {
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) throw_errno("poll", "a child's output");
    if (ready == 0) return false;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

// posix_spawn's file actions that send the child's stdout and stderr to `fd`.
class OutputTo {
 public:
  explicit OutputTo(int fd) {
    DTRAIN_SYSCALL_ERRNUM(::posix_spawn_file_actions_init(&actions_));
    try {
      DTRAIN_SYSCALL_ERRNUM(::posix_spawn_file_actions_adddup2(&actions_, fd, 1));
      DTRAIN_SYSCALL_ERRNUM(::posix_spawn_file_actions_adddup2(&actions_, fd, 2));
    } catch (...) {
      ::posix_spawn_file_actions_destroy(&actions_);
      throw;
    }
  }
  // Unchecked: destroy only frees what init allocated.
  ~OutputTo() { ::posix_spawn_file_actions_destroy(&actions_); }
  OutputTo(const OutputTo&) = delete;
  OutputTo& operator=(const OutputTo&) = delete;
  const posix_spawn_file_actions_t* get() const { return &actions_; }

 private:
  posix_spawn_file_actions_t actions_;
};

// Starts `argv` with its output into a new pipe; returns posix_spawnp's
// result, and in `read_fd` the pipe's reading end (-1 when it failed).
int spawn_with_output(const std::vector<std::string>& argv, pid_t& pid, int& read_fd) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe2", argv[0]);
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  int rc = 0;
  try {
    const OutputTo output(fds[1]);
    rc = ::posix_spawnp(&pid, args[0], output.get(), nullptr, args.data(), environ);
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  ::close(fds[1]);
  if (rc != 0) ::close(fds[0]);
  read_fd = rc == 0 ? fds[0] : -1;
  return rc;
}

// Runs `argv` (found on PATH) with stdout and stderr captured; returns its
// output, or nullopt when it could not start, failed or ran past `timeout`.
std::optional<std::string> capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                                   std::string& why) {
  pid_t pid = -1;
  int read_fd = -1;
  if (const int rc = spawn_with_output(argv, pid, read_fd); rc != 0) {
    why = fmt::format("cannot run {}: {}", argv[0], std::strerror(rc));
    return std::nullopt;
  }
  std::string out;
  const bool finished = read_until(read_fd, Clock::now() + timeout, out);
  ::close(read_fd);
  if (!finished) DTRAIN_SYSCALL(::kill(pid, SIGKILL), argv[0]);
  int status = 0;
  DTRAIN_SYSCALL(TEMP_FAILURE_RETRY(::waitpid(pid, &status, 0)), argv[0]);
  if (!finished) {
    why = fmt::format("{} did not answer within {} ms", argv[0], timeout.count());
    return std::nullopt;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    why = fmt::format("{} failed: {}", argv[0], out);
    return std::nullopt;
  }
  return out;
}

}  // namespace

std::optional<std::string> parse_node_addr(const std::string& scontrol_output) {
  const std::string key = "NodeAddr=";
  for (std::size_t at = scontrol_output.find(key); at != std::string::npos;
       at = scontrol_output.find(key, at + 1)) {
    if (at != 0 && !std::isspace(static_cast<unsigned char>(scontrol_output[at - 1]))) continue;
    const std::size_t start = at + key.size();
    std::size_t end = start;
    while (end < scontrol_output.size() && !std::isspace(static_cast<unsigned char>(scontrol_output[end]))) ++end;
    if (end > start) return scontrol_output.substr(start, end - start);
  }
  return std::nullopt;
}

std::string node_address(const std::string& node, std::chrono::milliseconds timeout) {
  if (resolvable(node)) return node;
  std::string why;
  const std::optional<std::string> out = capture({"scontrol", "show", "node", "-o", node}, timeout, why);
  if (out) {
    if (const std::optional<std::string> addr = parse_node_addr(*out)) return *addr;
    why = fmt::format("scontrol shows no NodeAddr: {}", *out);
  }
  throw Error(fmt::format(
      "cannot find an address for Slurm node '{}': the resolver does not know the name and {}. "
      "Set DTRAIN_STORE=host:port to an address of that node",
      node, why));
}

}  // namespace dtrain::cluster
