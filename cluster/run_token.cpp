#include "cluster/run_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::cluster {
namespace {

void write_all(int fd, const std::string& text, const std::string& path) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("write", path);
    done += static_cast<std::size_t>(n);
  }
}

// The token in `path`, or "" when the file does not exist (yet).
std::string try_read(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) {
    throw IoError(fmt::format("the run token file '{}' is empty; remove it and start the step again",
                              path.string()));
  }
  return token;
}

}  // namespace

std::string random_token() {
  std::random_device entropy;
  std::string token;
  for (int i = 0; i < 8; ++i) token += fmt::format("{:08x}", entropy());
  return token;
}

void write_token_file(const std::filesystem::path& path, const std::string& token) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) {
    throw IoError(fmt::format("cannot create '{}' for the run token file: {}", path.parent_path().string(),
                              ec.message()));
  }
  const std::string tmp = fmt::format("{}.tmp{}", path.string(), ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw_errno("open", tmp);
  try {
    if (::fchmod(fd, 0600) != 0) throw_errno("fchmod", tmp);  // an old file keeps its mode otherwise
    write_all(fd, token + "\n", tmp);
    if (::fsync(fd) != 0) throw_errno("fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    throw_errno("rename", path.string());
  }
}

std::string read_token_file(const std::filesystem::path& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    if (std::string token = try_read(path); !token.empty()) return token;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  throw TimeoutError(fmt::format(
      "the run token file '{}' did not appear within {:.1f} s: rank 0 writes it when it starts the store. "
      "Check that rank 0 started (its log), that train.out_dir is on storage every node sees, "
      "or export DTRAIN_TOKEN=<secret> for every task instead",
      path.string(), std::chrono::duration<double>(timeout).count()));
}

OwnedTokenFile::~OwnedTokenFile() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove(path_, ec);  // best effort: a leftover file is 0600 and names a finished step
}

OwnedTokenFile& OwnedTokenFile::operator=(OwnedTokenFile&& other) noexcept {
  if (this != &other) {
    OwnedTokenFile old(std::move(*this));
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

}  // namespace dtrain::cluster
