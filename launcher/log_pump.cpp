#include "launcher/log_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <fstream>

#include "core/error.h"

namespace dtrain::launcher {
namespace {

constexpr std::size_t kMaxLine = 64 * 1024;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk must not stop the job; the console still has the line
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

LogPump::LogPump(std::vector<LogSource> sources, Console& console) : console_(console) {
  for (auto& source : sources) {
    Stream s;
    s.file_fd = ::open(source.file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s.file_fd < 0) throw_errno("open the worker log", source.file.string());
    s.source = std::move(source);
    streams_.push_back(std::move(s));
  }
  thread_ = std::thread([this] { run(); });
}

LogPump::~LogPump() { finish(std::chrono::milliseconds(0)); }

void LogPump::finish(std::chrono::milliseconds timeout) {
  if (!thread_.joinable()) return;
  deadline_ns_ = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  finishing_ = true;
  thread_.join();
  for (auto& s : streams_) {
    if (!s.partial.empty()) emit(s, s.partial);
    ::close(s.source.fd);  // unchecked (core/syscall.h): a pipe, and a log whose write errors
    ::close(s.file_fd);    // do not stop the job either (write_all)
  }
  streams_.clear();
}

void LogPump::run() {
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    for (auto& s : streams_) {
      if (!s.open) continue;
      fds.push_back({s.source.fd, POLLIN, 0});
      owners.push_back(&s);
    }
    if (fds.empty()) return;
    if (finishing_ && now_ns() >= deadline_ns_) return;
    const int ready = ::poll(fds.data(), fds.size(), 100);
    if (ready < 0 && errno != EINTR) return;
    for (std::size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0 && !drain(*owners[i])) owners[i]->open = false;
    }
  }
}

bool LogPump::drain(Stream& s) {
  char buf[16384];
  const ssize_t n = ::read(s.source.fd, buf, sizeof buf);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  s.partial.append(buf, static_cast<std::size_t>(n));
  std::size_t start = 0;
  for (std::size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit(s, s.partial.substr(start, nl - start));
  }
  s.partial.erase(0, start);
  if (s.partial.size() > kMaxLine) {
    emit(s, s.partial);
    s.partial.clear();
  }
  return true;
}

void LogPump::emit(Stream& s, const std::string& line) {
  write_all(s.file_fd, line + "\n");
  console_.line(console_line(s.source.rank, line));
}

std::string console_line(int rank, const std::string& line) {
  if (line.rfind(fmt::format("[rank{}]:", rank), 0) == 0) return line;
  return fmt::format("[rank {}] {}", rank, line);
}

void keep_previous_log(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(file, ec)) return;
  const auto numbered = [&](int n) { return fs::path(file.string() + "." + std::to_string(n)); };
  int free = 1;
  while (fs::exists(numbered(free), ec)) ++free;
  for (int n = free; n >= 1; --n) {
    const fs::path from = n == 1 ? file : numbered(n - 1);
    fs::rename(from, numbered(n), ec);
    if (ec) {
      throw IoError(fmt::format("cannot keep the earlier log {} as {}: {}; check --log-dir", from.string(),
                                numbered(n).string(), ec.message()));
    }
  }
}

std::string tail_lines(const std::filesystem::path& file, int lines) {
  std::ifstream in(file);
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& line : last) out += line + "\n";
  return out;
}

}  // namespace dtrain::launcher
