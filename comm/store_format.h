// The byte layout of comm::TcpStore's TCP stream (messages: proto/store.proto).
//
//   frame   := length payload
//   length  := uint32, little-endian: the payload's size N in bytes
//   payload := N bytes of a serialized dtrain.store.Request (client to server)
//              or dtrain.store.Response (server to client)
//
// The first frame a client sends is a Request holding a Hello with kStoreMagic,
// kStoreVersion and the run's token. A frame longer than kStoreMaxFrameBytes
// (kStoreMaxHelloFrameBytes before the Hello is accepted) is refused: the
// receiver closes the connection rather than allocate what a garbled or
// hostile length asks for.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::comm {

inline constexpr std::uint32_t kStoreMagic = 0x54534444;  // "DDST" read as little-endian bytes
inline constexpr std::uint32_t kStoreVersion = 1;

inline constexpr std::size_t kStoreHeaderBytes = 4;
inline constexpr std::uint32_t kStoreMaxFrameBytes = 64u << 20;
// An unauthenticated peer may not make the server allocate more than this.
inline constexpr std::uint32_t kStoreMaxHelloFrameBytes = 64u << 10;

inline void encode_frame_length(std::uint32_t n, std::uint8_t* out) {
  for (std::size_t i = 0; i < kStoreHeaderBytes; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
}

inline std::uint32_t decode_frame_length(const std::uint8_t* in) {
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < kStoreHeaderBytes; ++i) n |= static_cast<std::uint32_t>(in[i]) << (8 * i);
  return n;
}

}  // namespace dtrain::comm
