// The one error policy of dtrain (docs/ARCHITECTURE.md): typed exceptions from
// dtrain::Error, DTRAIN_CHECK for invariants, exit() only in main().
// Messages say what failed, where (rank, file, field, tensor) and what to do.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A file or device could not be read or written, or a system call failed
// (core/syscall.h).
class IoError : public Error {
 public:
  using Error::Error;
};

// A wait ran past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A collective or the store failed.
class CommError : public Error {
 public:
  using Error::Error;
};

// A dataset's contents are not what its format promises.
class DataError : public Error {
 public:
  using Error::Error;
};

// The configuration is invalid; field() names the offending field ("model.d_model").
class ConfigError : public Error {
 public:
  ConfigError(std::string field, const std::string& message)
      : Error(fmt::format("config field '{}': {}", field, message)), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// Throws IoError naming the call, the path and errno's text.
[[noreturn]] void throw_errno(const std::string& what, const std::string& path);

}  // namespace dtrain

// DTRAIN_CHECK(cond, fmt, args...): an invariant of the code, not of the input.
#define DTRAIN_CHECK(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      throw ::dtrain::Error(fmt::format("internal check failed at {}:{}: {}: {}",        \
                                        __FILE__, __LINE__, #cond,                       \
                                        fmt::format(__VA_ARGS__)));                      \
    }                                                                                    \
  } while (0)
