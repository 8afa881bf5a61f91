// The IDX format of (Fashion-)MNIST, here gzip-compressed (*.gz).
//
// Byte layout after decompression, all integers big-endian uint32:
//   images (idx3): magic 0x00000803, N, rows, cols, then N*rows*cols uint8 pixels,
//                  each image row-major, 0 = background
//   labels (idx1): magic 0x00000801, N, then N uint8 labels
// The magic's low byte is the number of dimensions, 0x08 the element type (uint8).
#pragma once

#include <cstdint>

namespace dtrain::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;
inline constexpr int kIdxImagesHeaderBytes = 16;
inline constexpr int kIdxLabelsHeaderBytes = 8;

}  // namespace dtrain::data
