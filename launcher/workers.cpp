#include "launcher/workers.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/exit_codes.h"
#include "core/syscall.h"

namespace dtrain::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Everything the child needs, built before fork: after it only
// async-signal-safe calls are allowed.
struct ExecImage {
  std::vector<std::string> strings;
  std::vector<char*> argv, envp;
  std::string failure;  // written by the child when exec fails
};

ExecImage make_image(const std::vector<std::string>& command, std::map<std::string, std::string> env) {
  ExecImage image;
  image.strings = command;
  const std::size_t argc = image.strings.size();
  for (const auto& [k, v] : env) image.strings.push_back(k + "=" + v);
  for (std::size_t i = 0; i < image.strings.size(); ++i) {
    (i < argc ? image.argv : image.envp).push_back(image.strings[i].data());
  }
  image.argv.push_back(nullptr);
  image.envp.push_back(nullptr);
  image.failure = fmt::format("dtrain-launch: cannot execute '{}': not found on PATH or not executable\n",
                              command.front());
  return image;
}

// A failure before exec ends the child with exit code 127 (kExitNotExecutable), its reason
// written to the rank's log (out_fd).
[[noreturn]] void exec_child(const ExecImage& image, int out_fd, int null_fd, pid_t parent) {
  DTRAIN_SYSCALL_IN_CHILD(::setpgid(0, 0), out_fd);
  DTRAIN_SYSCALL_IN_CHILD(::prctl(PR_SET_PDEATHSIG, SIGKILL), out_fd);
  if (::getppid() != parent) ::_exit(kExitNotExecutable);  // the agent died before prctl took effect
  sigset_t none;
  sigemptyset(&none);
  DTRAIN_SYSCALL_IN_CHILD(::sigprocmask(SIG_SETMASK, &none, nullptr), out_fd);
  DTRAIN_SYSCALL_IN_CHILD(::dup2(null_fd, 0), out_fd);
  DTRAIN_SYSCALL_IN_CHILD(::dup2(out_fd, 1), out_fd);
  DTRAIN_SYSCALL_IN_CHILD(::dup2(out_fd, 2), out_fd);
  ::execvpe(image.argv[0], image.argv.data(), image.envp.data());
  [[maybe_unused]] const ssize_t n = ::write(2, image.failure.data(), image.failure.size());
  ::_exit(kExitNotExecutable);
}

}  // namespace

std::string signal_name(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", signal);
}

std::optional<std::filesystem::path> find_program(const std::string& program, const std::string& path) {
  if (program.find('/') != std::string::npos) return std::filesystem::path(program);
  for (std::size_t start = 0; start <= path.size();) {
    const std::size_t colon = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, colon - start);
    const std::filesystem::path file = std::filesystem::path(dir.empty() ? "." : dir) / program;
    if (::access(file.c_str(), X_OK) == 0 && !std::filesystem::is_directory(file)) return file;
    start = colon + 1;
  }
  return std::nullopt;
}

bool WorkerExit::ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string WorkerExit::describe() const {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("signal {}{}", signal_name(WTERMSIG(status)), WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return fmt::format("wait status {}", status);
}

WorkerGroup::~WorkerGroup() { stop(std::chrono::milliseconds(0), SIGKILL); }

void WorkerGroup::start(const std::vector<std::string>& command, const std::map<std::string, std::string>& base_env,
                        const std::vector<WorkerSpec>& specs, const std::filesystem::path& log_dir) {
  log_dir_ = log_dir;
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) throw_errno("open", "/dev/null");
  std::vector<LogSource> sources;
  for (const WorkerSpec& spec : specs) {
    std::map<std::string, std::string> env = base_env;
    for (const auto& [k, v] : spec.env) env[k] = v;
    const ExecImage image = make_image(command, std::move(env));
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe2", "");
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(image, fds[1], null_fd, parent);
    ::close(fds[1]);
    if (pid < 0) {
      ::close(fds[0]);
      ::close(null_fd);
      stop(std::chrono::milliseconds(0), SIGKILL);
      throw_errno(fmt::format("fork for rank {}", spec.rank), command.front());
    }
    // Also here, so a signal sent right away reaches the group. Unchecked: the
    // child's own setpgid(0, 0) is the one that must work (a failure there
    // ends it with 127), and this one fails with EACCES once it has exec'd.
    ::setpgid(pid, pid);
    procs_.push_back({spec.rank, pid, true, 0});
    sources.push_back({fds[0], spec.rank, log_dir / fmt::format("rank_{}.log", spec.rank)});
  }
  ::close(null_fd);
  pump_ = std::make_unique<LogPump>(std::move(sources), console_);
}

std::vector<WorkerExit> WorkerGroup::reap() {
  std::vector<WorkerExit> exits;
  for (Proc& p : procs_) {
    if (!p.running) continue;
    int status = 0;
    const pid_t r = ::waitpid(p.pid, &status, WNOHANG);
    if (r == p.pid || (r < 0 && errno == ECHILD)) {
      p.running = false;
      p.status = status;
      exits.push_back({p.rank, p.pid, status});
    }
  }
  return exits;
}

bool WorkerGroup::all_exited() const {
  for (const Proc& p : procs_) {
    if (p.running) return false;
  }
  return true;
}

int WorkerGroup::running() const {
  int n = 0;
  for (const Proc& p : procs_) n += p.running ? 1 : 0;
  return n;
}

bool WorkerGroup::all_succeeded() const {
  for (const Proc& p : procs_) {
    if (p.running || !WorkerExit{p.rank, p.pid, p.status}.ok()) return false;
  }
  return true;
}

// Reported rather than thrown, so that the other groups are still signalled:
// this runs on the way out, also from the destructor. A running worker's
// group holds at least its zombie, so even ESRCH means the worker left it.
void WorkerGroup::signal_all(int signal) {
  for (const Proc& p : procs_) {
    if (!p.running) continue;
    try {
      DTRAIN_SYSCALL(::kill(-p.pid, signal), fmt::format("cannot send {} to rank {}", signal_name(signal), p.rank));
    } catch (const IoError& e) {
      console_.say(e.what());
    }
  }
}

void WorkerGroup::stop(std::chrono::milliseconds grace, int first) {
  reap();
  if (!all_exited()) {
    signal_all(first);
    const auto until = Clock::now() + grace;
    while (Clock::now() < until && (reap(), !all_exited())) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    signal_all(SIGKILL);
    for (Proc& p : procs_) {
      if (p.running && ::waitpid(p.pid, &p.status, 0) >= 0) p.running = false;
      p.running = false;
    }
  }
  finish_logs();
}

void WorkerGroup::finish_logs() {
  if (pump_) pump_->finish(std::chrono::seconds(2));
  pump_.reset();
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (const Proc& p : procs_) out.push_back(p.pid);
  return out;
}

}  // namespace dtrain::launcher
