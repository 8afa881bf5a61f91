#include "core/pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace dtrain {

void* allocate_pages(std::size_t bytes) {
  const bool huge = bytes >= kHugePageBytes;
  const std::size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(huge ? kHugePageBytes : 64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  // Advice only: a kernel without THP refuses it, and the pages stay small.
  // The tail past the last whole 2 MiB keeps 4 KiB pages, so no buffer
  // takes more memory than it asked for.
  if (huge) (void)::madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
  std::memset(p, 0, rounded);
  return p;
}

void release_pages(void* p) noexcept { std::free(p); }

}  // namespace dtrain
