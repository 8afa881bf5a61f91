#include "checkpoint/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "core/error.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;

void Env::write_file(const fs::path& path, std::string_view data, bool sync) {
  auto file = new_writable_file(path);
  file->append(data.data(), data.size());
  if (sync) file->sync();
  file->close();
}

std::string Env::read_file(const fs::path& path) {
  std::string data(file_size(path), '\0');
  read(path, 0, data.size(), data.data());
  return data;
}

namespace {

[[noreturn]] void throw_ec(const std::string& what, const fs::path& path, const std::error_code& ec) {
  throw IoError(fmt::format("{} '{}': {}", what, path.string(), ec.message()));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(fs::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void append(const void* data, std::size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw_errno("write", path_.string());
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }

  void sync() override {
    if (::fsync(fd_) != 0) throw_errno("fsync", path_.string());
  }

  void close() override {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) throw_errno("close", path_.string());
  }

 private:
  fs::path path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  std::unique_ptr<WritableFile> new_writable_file(const fs::path& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw_errno("create (exclusive)", path.string());
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  void sync_dir(const fs::path& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw_errno("open directory", dir.string());
    const int rc = ::fsync(fd);
    ::close(fd);
    if (rc != 0) throw_errno("fsync directory", dir.string());
  }

  void rename(const fs::path& from, const fs::path& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      throw_errno(fmt::format("rename to '{}' from", to.string()), from.string());
    }
  }

  void remove_file(const fs::path& path) override {
    if (::unlink(path.c_str()) != 0) throw_errno("remove", path.string());
  }

  void remove_all(const fs::path& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) throw_ec("remove", path, ec);
  }

  std::vector<std::string> list_dir(const fs::path& dir) override {
    std::error_code ec;
    std::vector<std::string> names;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    if (ec) throw_ec("list directory", dir, ec);
    std::sort(names.begin(), names.end());
    return names;
  }

  void read(const fs::path& path, std::uint64_t offset, std::size_t n, void* out) override;

  std::uint64_t file_size(const fs::path& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_errno("stat", path.string());
    return static_cast<std::uint64_t>(st.st_size);
  }

  bool exists(const fs::path& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }

  bool is_directory(const fs::path& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  void create_directories(const fs::path& dir) override {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw_ec("create directory", dir, ec);
  }

  void truncate(const fs::path& path, std::uint64_t size) override {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) throw_errno("truncate", path.string());
  }
};

void PosixEnv::read(const fs::path& path, std::uint64_t offset, std::size_t n, void* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("open", path.string());
  char* p = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      errno = err;
      throw_errno("read", path.string());
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  if (done < n) {
    throw IoError(fmt::format("read '{}': file ends after {} bytes, wanted {} bytes at offset {}",
                              path.string(), offset + done, n, offset));
  }
}

}  // namespace

Env* default_env() {
  static PosixEnv env;
  return &env;
}

}  // namespace dtrain::checkpoint
