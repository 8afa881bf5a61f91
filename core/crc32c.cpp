#include "core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace dtrain {
namespace {

constexpr std::uint32_t kPolyReflected = 0x82F63B78;

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> kTable = make_table();

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (std::size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__SSE4_2__) && defined(__x86_64__)
namespace {

// The crc32 instruction has a latency of 3 cycles and a throughput of 1, so
// three independent streams over consecutive blocks run about three times as
// fast as one; the three crcs are then combined by "shifting" a crc over
// the zeros that stand for the following blocks (Mark Adler's method: a
// linear operator on GF(2)^32, applied bytewise through four tables).
constexpr std::size_t kLong = 8192;  // bytes per stream, long blocks
constexpr std::size_t kShort = 256;  // bytes per stream, the tail

using Matrix = std::array<std::uint32_t, 32>;
using ShiftTables = std::array<std::array<std::uint32_t, 256>, 4>;

constexpr std::uint32_t times(const Matrix& mat, std::uint32_t vec) {
  std::uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[static_cast<std::size_t>(i)];
  }
  return sum;
}

constexpr Matrix square(const Matrix& mat) {
  Matrix sq{};
  for (std::size_t n = 0; n < 32; ++n) sq[n] = times(mat, mat[n]);
  return sq;
}

// The operator that appends `len` zero bytes to a crc (len a power of two >= 1).
constexpr Matrix zeros_operator(std::size_t len) {
  Matrix odd{};  // one zero bit
  odd[0] = kPolyReflected;
  for (std::uint32_t n = 1, row = 1; n < 32; ++n, row <<= 1) odd[n] = row;
  Matrix even = square(odd);  // two zero bits
  odd = square(even);         // four
  do {                        // each squaring doubles the zeros: 8 bits = 1 byte, then len bytes
    even = square(odd);
    len >>= 1;
    if (len == 0) return even;
    odd = square(even);
    len >>= 1;
  } while (len != 0);
  return odd;
}

constexpr ShiftTables shift_tables(std::size_t len) {
  const Matrix op = zeros_operator(len);
  ShiftTables t{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    for (std::size_t k = 0; k < 4; ++k) t[k][n] = times(op, n << (8 * k));
  }
  return t;
}

constexpr ShiftTables kShiftLong = shift_tables(kLong);
constexpr ShiftTables kShiftShort = shift_tables(kShort);

std::uint64_t shift(const ShiftTables& t, std::uint64_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][(crc >> 24) & 0xff];
}

std::uint64_t load64(const unsigned char* p) {
  std::uint64_t word;
  std::memcpy(&word, p, sizeof word);  // unaligned-safe; compiles to one load
  return word;
}

// Three streams over blocks of `block` bytes while 3 * block bytes remain.
void three_streams(std::size_t block, const ShiftTables& t, const unsigned char*& p, std::size_t& n,
                   std::uint64_t& c0) {
  while (n >= 3 * block) {
    std::uint64_t c1 = 0, c2 = 0;
    for (const unsigned char* end = p + block; p < end; p += 8) {
      c0 = _mm_crc32_u64(c0, load64(p));
      c1 = _mm_crc32_u64(c1, load64(p + block));
      c2 = _mm_crc32_u64(c2, load64(p + 2 * block));
    }
    c0 = shift(t, c0) ^ c1;
    c0 = shift(t, c0) ^ c2;
    p += 2 * block;
    n -= 3 * block;
  }
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  three_streams(kLong, kShiftLong, p, n, c);
  three_streams(kShort, kShiftShort, p, n, c);
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#else
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) {
  return crc32c_portable(data, n, crc);
}
#endif

}  // namespace dtrain
