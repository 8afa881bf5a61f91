#include "core/process.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cerrno>

#include "core/syscall.h"

namespace dtrain {
namespace {

// AddressSanitizer replaces malloc; its mallopt is a stub that reports
// failure, and its allocator has none of these settings.
#if defined(__SANITIZE_ADDRESS__)  // -fsanitize=address (GCC and clang)
constexpr bool kGlibcMalloc = false;
#else
constexpr bool kGlibcMalloc = true;
#endif

// mallopt returns 1, or 0 (without errno) for a parameter or value glibc
// rejects: that is EINVAL.
void check_mallopt(int result, const CallSite& site) {
  if (kGlibcMalloc && result != 1) throw_call_error(EINVAL, site, "setting glibc's malloc policy");
}

#define DTRAIN_MALLOPT(param, value) \
  check_mallopt(::mallopt(param, value), CallSite{"mallopt(" #param ", " #value ")", __FILE__, __LINE__})

}  // namespace

void configure_malloc_for_training() {
  DTRAIN_MALLOPT(M_MMAP_MAX, 0);
  DTRAIN_MALLOPT(M_TRIM_THRESHOLD, -1);
  DTRAIN_MALLOPT(M_TOP_PAD, 64 << 20);
  // One arena: a second thread (the comm thread) would otherwise get its own
  // arena, which grows in 64 MiB heaps and serves larger blocks by mmap and
  // munmap on every free, whatever M_MMAP_MAX says (Open MPI's 32 MiB scratch
  // at a 64 MiB allreduce faulted 8194 pages per call this way).
  DTRAIN_MALLOPT(M_ARENA_MAX, 1);
}

long minor_page_faults() {
  rusage usage{};
  DTRAIN_SYSCALL(::getrusage(RUSAGE_SELF, &usage));
  return usage.ru_minflt;
}

std::int64_t peak_rss_bytes() {
  rusage usage{};
  DTRAIN_SYSCALL(::getrusage(RUSAGE_SELF, &usage));
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux counts KiB
}

double peak_rss_mb() { return static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0); }

}  // namespace dtrain
