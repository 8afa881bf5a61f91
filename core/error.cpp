#include "core/error.h"

#include <cerrno>
#include <cstring>

namespace dtrain {

void throw_errno(const std::string& what, const std::string& path) {
  const int err = errno;
  throw IoError(fmt::format("{} '{}': {}", what, path, std::strerror(err)));
}

}  // namespace dtrain
