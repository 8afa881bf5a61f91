// Memory for buffers a training step streams through: 64-byte aligned,
// zero-filled and touched at allocation (fresh pages cost ~15 us each on
// first touch, so steady-state steps must only reuse memory).
//
// Buffers of 2 MiB or more are 2 MiB aligned and their whole 2 MiB pages are
// asked for transparent huge pages (madvise(MADV_HUGEPAGE); the kernel's
// default "madvise" mode gives them only to regions that ask); the tail past
// the last whole 2 MiB keeps 4 KiB pages, so a buffer takes no more memory
// than before. A kernel streaming over an activation then takes one TLB
// entry per 2 MiB instead of 512, and its first touch faults once per 2 MiB.
// Where the kernel has THP off, or no huge page is free, the region keeps
// 4 KiB pages.
#pragma once

#include <cstddef>

namespace dtrain {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Never null, even for 0 bytes: throws std::bad_alloc. Free with release_pages.
void* allocate_pages(std::size_t bytes);
void release_pages(void* p) noexcept;

}  // namespace dtrain
