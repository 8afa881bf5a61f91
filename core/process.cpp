#include "core/process.h"

#include <malloc.h>
#include <sys/resource.h>

namespace dtrain {

void configure_malloc_for_training() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  mallopt(M_TOP_PAD, 64 << 20);
  // One arena: a second thread (the comm thread) would otherwise get its own
  // arena, which grows in 64 MiB heaps and serves larger blocks by mmap and
  // munmap on every free, whatever M_MMAP_MAX says (Open MPI's 32 MiB scratch
  // at a 64 MiB allreduce faulted 8194 pages per call this way).
  mallopt(M_ARENA_MAX, 1);
}

long minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

}  // namespace dtrain
