// CRC-32C (Castagnoli, iSCSI polynomial 0x1EDC6F41, reflected): the checksum
// of every checkpoint range and of every TensorBoard event record (TFRecord
// framing, telemetry/event_file_format.h). Uses the SSE4.2 crc32 instruction when the build
// targets a CPU that has it, a table otherwise; both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain {

// The crc32c of data[0, n). Pass a previous result as `crc` to extend it:
// crc32c(b, nb, crc32c(a, na)) == crc32c of a followed by b.
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0);

// The table implementation, exposed so tests can compare it with the fast one.
std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc = 0);

}  // namespace dtrain
