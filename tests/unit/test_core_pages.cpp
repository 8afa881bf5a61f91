// core/pages.h: every buffer comes back aligned and zero-filled; from 2 MiB
// up it is 2 MiB aligned and, where the kernel has transparent huge pages on
// (or on request), backed by them.
#include "core/pages.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/aligned_buffer.h"

namespace dtrain {
namespace {

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

bool all_zero(const void* p, std::size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  return std::all_of(b, b + bytes, [](unsigned char c) { return c == 0; });
}

// The mapping of /proc/self/smaps that holds p: its AnonHugePages (kB,
// -1 if not found) and whether its VmFlags carry "hg" (MADV_HUGEPAGE).
struct Mapping {
  long huge_kb = -1;
  bool advised = false;
};

Mapping mapping_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  Mapping m;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= address(p) && address(p) < end;
      continue;
    }
    if (!inside) continue;
    if (line.starts_with("AnonHugePages:")) m.huge_kb = std::stol(line.substr(14));
    if (line.starts_with("VmFlags:")) m.advised = (line + " ").find(" hg ") != std::string::npos;
  }
  return m;
}

std::string thp_setting(const char* name) {
  std::ifstream f(std::string("/sys/kernel/mm/transparent_hugepage/") + name);
  std::string modes;
  std::getline(f, modes);
  return modes;
}

TEST(Pages, SmallBuffersAre64ByteAlignedAndZero) {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{4096 + 5},
                            kHugePageBytes - 1}) {
    void* p = allocate_pages(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(address(p) % 64, 0u) << bytes;
    EXPECT_TRUE(all_zero(p, bytes)) << bytes;
    std::memset(p, 0xab, bytes);  // all of it is ours
    release_pages(p);
  }
}

TEST(Pages, LargeBuffersAreHugePageAlignedAndZero) {
  for (std::size_t bytes : {kHugePageBytes, kHugePageBytes + 1, 3 * kHugePageBytes + 4096}) {
    void* p = allocate_pages(bytes);
    EXPECT_EQ(address(p) % kHugePageBytes, 0u) << bytes;
    EXPECT_TRUE(all_zero(p, bytes)) << bytes;
    std::memset(p, 0xab, bytes);
    release_pages(p);
  }
}

// The advice is dtrain's part and holds on every kernel with transparent
// huge pages; whether a huge page then backs the buffer is the kernel's, and
// the test asks it only of the settings that promise one.
TEST(Pages, LargeBuffersAskForHugePagesAndGetThemWhereTheKernelPromises) {
  AlignedBuffer<float> big(4 * kHugePageBytes / sizeof(float));
  const Mapping m = mapping_at(big.data());
  ASSERT_GE(m.huge_kb, 0) << "no mapping in /proc/self/smaps holds the buffer";
  const std::string modes = thp_setting("enabled"), defrag = thp_setting("defrag");
  if (modes.empty()) {  // a kernel built without them: the advice is refused
    EXPECT_FALSE(m.advised);
    EXPECT_EQ(m.huge_kb, 0);
    return;
  }
  EXPECT_TRUE(m.advised) << "an 8 MiB buffer's mapping lacks MADV_HUGEPAGE (VmFlags hg)";
  if (modes.find("[never]") != std::string::npos) {
    EXPECT_EQ(m.huge_kb, 0) << "THP mode '" << modes << "' gave huge pages";
    return;
  }
  // Only "always", "madvise" and "defer+madvise" compact memory at the fault
  // of a region that asked; under "defer" or "never" a huge page comes only
  // where one happens to be free, so the page size is not asked of them.
  if (defrag.find("[defer]") == std::string::npos && defrag.find("[never]") == std::string::npos) {
    EXPECT_GE(m.huge_kb, static_cast<long>(kHugePageBytes / 1024))
        << "THP mode '" << modes << "', defrag '" << defrag << "': an 8 MiB buffer got no 2 MiB page";
  }
}

TEST(Pages, AlignedBufferUsesThem) {
  AlignedBuffer<double> small(3), big(kHugePageBytes / sizeof(double));
  EXPECT_EQ(address(small.data()) % 64, 0u);
  EXPECT_EQ(address(big.data()) % kHugePageBytes, 0u);
  EXPECT_TRUE(all_zero(big.data(), kHugePageBytes));
}

}  // namespace
}  // namespace dtrain
