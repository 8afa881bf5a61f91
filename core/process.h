// Process-wide set-up shared by the binaries.
#pragma once

#include <cstdint>

namespace dtrain {

// Keeps freed memory in the process (no trimming, no per-allocation mmap), so
// a buffer freed and allocated again does not pay page faults a second time.
// Call first thing in main(). Throws IoError when glibc refuses a setting
// (never under AddressSanitizer, whose allocator has none to set).
void configure_malloc_for_training();

// Minor page faults of this process so far (getrusage ru_minflt): a cheap
// measure of fresh memory touched, used by tests and benchmarks.
long minor_page_faults();

// Peak resident set size of this process, in bytes and in MiB.
std::int64_t peak_rss_bytes();
double peak_rss_mb();

}  // namespace dtrain
