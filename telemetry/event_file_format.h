// The byte layout of a TensorBoard event file,
// <dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter>: TFRecord
// framing around serialized tensorboard.Event messages (proto/tensorboard.proto).
// All integers little-endian.
//
//   a record:  offset 0      length      u64, n = the bytes of the Event
//              offset 8      length crc  u32, masked CRC-32C of bytes [0, 8)
//              offset 12     data        n bytes, the serialized Event
//              offset 12+n   data crc    u32, masked CRC-32C of the data
//   a file:    records back to back, nothing before or after them; the first
//              record's Event holds file_version "brain.Event:2".
//
// The mask (TFRecord's, so that a CRC of bytes that hold CRCs is not
// degenerate): ((crc >> 15) | (crc << 17)) + kCrcMaskDelta, mod 2^32.
// A reader takes a file as far as its last whole record: a writer killed in
// the middle of one leaves a cut record at the end, which readers skip.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/crc32c.h"

namespace dtrain::telemetry {

static_assert(std::endian::native == std::endian::little,
              "TFRecord lengths and CRCs are little-endian; a big-endian host would need byte swaps");

inline constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";
inline constexpr std::string_view kEventFileVersion = "brain.Event:2";
inline constexpr std::uint32_t kCrcMaskDelta = 0xa282ead8u;
inline constexpr std::size_t kRecordHeaderBytes = 12;  // length and its CRC
inline constexpr std::size_t kRecordFooterBytes = 4;   // the data's CRC

inline constexpr std::uint32_t mask_crc(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta; }

inline constexpr std::uint32_t unmask_crc(std::uint32_t masked) {
  const std::uint32_t rotated = masked - kCrcMaskDelta;
  return (rotated >> 17) | (rotated << 15);
}

// Appends one record holding `data` to `out`.
inline void append_record(std::string_view data, std::string& out) {
  unsigned char header[kRecordHeaderBytes];
  const std::uint64_t length = data.size();
  std::memcpy(header, &length, 8);
  const std::uint32_t length_crc = mask_crc(crc32c(header, 8));
  std::memcpy(header + 8, &length_crc, 4);
  const std::uint32_t data_crc = mask_crc(crc32c(data.data(), data.size()));
  out.append(reinterpret_cast<const char*>(header), kRecordHeaderBytes);
  out.append(data);
  out.append(reinterpret_cast<const char*>(&data_crc), kRecordFooterBytes);
}

enum class RecordStatus { ok, end, cut, corrupt };

// Reads the record at the front of `in`: on ok, `data` views its payload and
// `in` moves past it; `end` when `in` is empty; `cut` when `in` ends inside
// the record (a writer stopped mid-record); `corrupt` when a CRC does not
// match. `in` is left as it was unless ok.
inline RecordStatus read_record(std::string_view& in, std::string_view& data) {
  if (in.empty()) return RecordStatus::end;
  if (in.size() < kRecordHeaderBytes) return RecordStatus::cut;
  std::uint64_t length = 0;
  std::uint32_t length_crc = 0;
  std::memcpy(&length, in.data(), 8);
  std::memcpy(&length_crc, in.data() + 8, 4);
  if (unmask_crc(length_crc) != crc32c(in.data(), 8)) return RecordStatus::corrupt;
  if (in.size() - kRecordHeaderBytes < length || in.size() - kRecordHeaderBytes - length < kRecordFooterBytes) {
    return RecordStatus::cut;
  }
  std::uint32_t data_crc = 0;
  std::memcpy(&data_crc, in.data() + kRecordHeaderBytes + length, 4);
  data = in.substr(kRecordHeaderBytes, length);
  if (unmask_crc(data_crc) != crc32c(data.data(), data.size())) return RecordStatus::corrupt;
  in.remove_prefix(kRecordHeaderBytes + length + kRecordFooterBytes);
  return RecordStatus::ok;
}

}  // namespace dtrain::telemetry
