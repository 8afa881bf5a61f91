#include "core/syscall.h"

#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {
namespace {

// `file` without the source tree's directory, which this file's own path
// names: "comm/gloo/backend.cpp". Async-signal-safe (no library call).
const char* relative_file(const char* file) {
  static constexpr char kThisFile[] = __FILE__;
  static constexpr char kThisName[] = "core/syscall.cpp";
  constexpr std::size_t kPrefix = sizeof kThisFile - sizeof kThisName;
  for (std::size_t i = 0; i < kPrefix; ++i) {
    if (file[i] != kThisFile[i]) return file;  // also stops at the end of a shorter `file`
  }
  return file + kPrefix;
}

// write(2) of a whole C string; a failure leaves nothing else to try.
void write_text(int fd, const char* text) {
  std::size_t n = 0;
  while (text[n] != '\0') ++n;
  while (n > 0) {
    const ssize_t w = ::write(fd, text, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    text += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

void throw_call_error(int err, const CallSite& site, std::string_view subject) {
  const std::string where =
      fmt::format("{} failed at {}:{}: {}", site.call, relative_file(site.file), site.line, std::strerror(err));
  throw IoError(subject.empty() ? where : fmt::format("{}: {}", subject, where));
}

void check_in_child(bool failed, const CallSite& site, int log_fd) noexcept {
  if (!failed) return;
  const int err = errno;
  char line[16];
  char* p = line + sizeof line;
  *--p = '\0';
  unsigned v = static_cast<unsigned>(site.line);
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  // strerrordesc_np: glibc's untranslated table, a lookup without a lock or
  // allocation (strerror may take the locale's).
  const char* desc = ::strerrordesc_np(err);
  for (const char* piece : {"dtrain: ", site.call, " failed at ", relative_file(site.file), ":",
                            static_cast<const char*>(p), " in a forked child: ", desc != nullptr ? desc : "unknown error",
                            "\n"}) {
    write_text(log_fd, piece);
  }
  ::_exit(127);
}

}  // namespace dtrain
